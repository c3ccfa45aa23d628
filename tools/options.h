// Options bound to the config structs' members, for the three commands: the member's value
// before parsing is the default --help shows (and the man page, made from --help), so each
// default is written once, in its struct. Sizes are read with K/M/G/T (stage::parse_size) and
// shown the same way; a word from a fixed list stands for a value (an enum, on/off). A value
// that does not parse is a usage error "NAME: why" (CLI::ValidationError, exit status 2).
// Every number on the three command lines passes one check, finite_number(): NaN and
// infinities (which compare false with every bound, so a range check alone lets them through
// and, say, turns a timeout off) are refused with exit status 2. Seconds (FLOAT) go through
// seconds(), counts (INT, UINT) through whole(), sizes (SIZE) through add_size().
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bcast/io/chunk.h"
#include "bcast/io/manifest.h"
#include "bcast/transfer/pipeline.h"

namespace stagetools {

// The one check of a number given on a command line: the whole text is a finite number
// (strtod's syntax). NaN, infinities and what overflows a double (1e400) give nothing.
inline std::optional<double> finite_number(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Empty if text is a finite number within [lo, hi] (and whole, if asked), else why not:
// "not a whole number: 'nan'", "-1 is out of range: give 0 to 60 seconds".
inline std::string number_in(const std::string& text, double lo, double hi, bool whole_only,
                             const char* unit) {
  const auto v = finite_number(text);
  if (!v || (whole_only && std::floor(*v) != *v))
    return std::string("not a ") + (whole_only ? "whole number" : "number") + (*unit ? " of " : "") + unit +
           ": '" + text + "'";
  if (*v < lo || *v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s is out of range: give %.15g to %.15g%s%s", text.c_str(), lo, hi,
                  *unit ? " " : "", unit);
    return buf;
  }
  return {};
}

// A number of seconds within [lo, hi] (a FLOAT option); 1e300 is refused by its range, as it
// would overflow the clocks it feeds.
inline CLI::Validator seconds(double lo, double hi) {
  return CLI::Validator([lo, hi](std::string& text) { return number_in(text, lo, hi, false, "seconds"); },
                        "SECONDS");
}

// A whole number within [lo, hi] (an INT or UINT option; CLI11 then converts it).
inline CLI::Validator whole(double lo, double hi) {
  return CLI::Validator([lo, hi](std::string& text) { return number_in(text, lo, hi, true, ""); }, "");
}

// An explanation if the size is out of range, or nothing.
using SizeCheck = std::function<std::optional<std::string>(uint64_t)>;

// `malformed` begins the message for a value that is not a size at all.
inline CLI::Option* add_size(CLI::App& app, const std::string& name, uint64_t& target,
                             const std::string& desc, SizeCheck check = {},
                             std::string malformed = "not a size") {
  return app
      .add_option_function<std::string>(
          name,
          [t = &target, name, check = std::move(check),
           malformed = std::move(malformed)](const std::string& text) {
            const auto n = stage::parse_size(text);
            if (!n) throw CLI::ValidationError(name, malformed + ": '" + text + "'");
            if (check)
              if (auto why = check(*n)) throw CLI::ValidationError(name, *why);
            *t = *n;
          },
          desc)
      ->type_name("SIZE")
      ->default_str(stage::size_text(target));
}

template <class T>
CLI::Option* add_choice(CLI::App& app, const std::string& name, T& target,
                        std::vector<std::pair<std::string, T>> words, const std::string& desc) {
  std::vector<std::string> names;
  std::string shown;
  for (const auto& [word, value] : words) {
    names.push_back(word);
    if (shown.empty() && value == target) shown = word;
  }
  return app
      .add_option_function<std::string>(
          name,
          [t = &target, words = std::move(words)](const std::string& text) {
            for (const auto& [word, value] : words)
              if (word == text) *t = value;
          },
          desc)
      ->check(CLI::IsMember(names))
      ->default_str(shown);
}

// --bcast-segment, for both tools: the chain/tree message size (0, the default, is
// kDefaultSegment); `whose` says which rank's value every rank follows.
inline CLI::Option* add_bcast_segment(CLI::App& app, uint64_t& target, const std::string& whose) {
  const std::string range = "give a size from 4K to 64M";
  return add_size(
             app, "--bcast-segment", target,
             "chain/tree message size, 4K..64M (default 60K: under Open MPI's TCP eager limit; try 1M on "
             "RDMA fabrics); " +
                 whose,
             [range](uint64_t n) -> std::optional<std::string> {
               if (n >= 4096 && n <= 64 * stage::kMiB) return std::nullopt;
               return range + ": '" + stage::size_text(n) + "'";
             },
             range)
      ->default_str("");
}

// --bcast-algorithm's words, for both tools: the names bcast/transfer/pipeline.h gives the algorithms.
inline std::vector<std::pair<std::string, stage::BcastAlgorithm>> bcast_algorithms() {
  std::vector<std::pair<std::string, stage::BcastAlgorithm>> words;
  for (auto a : {stage::BcastAlgorithm::automatic, stage::BcastAlgorithm::chain, stage::BcastAlgorithm::tree,
                 stage::BcastAlgorithm::mpi})
    words.emplace_back(stage::to_string(a), a);
  return words;
}

// --source-version, for both tools: what identifies a version of a source file.
inline std::vector<std::pair<std::string, stage::SourceVersion>> source_versions() {
  return {{"full", stage::SourceVersion::full}, {"no-inode", stage::SourceVersion::no_inode}};
}
inline const char* const kSourceVersionHelp =
    "what identifies a version of a source file, for reusing a node's copy made by an earlier run: "
    "full (size, mtime, ctime and inode number), no-inode (size, mtime and ctime: for a source "
    "whose inode numbers change between mounts or nodes, e.g. a FUSE filesystem without use_ino or "
    "an object-store mount; two different files with the same size, mtime and ctime are then taken "
    "for one). Every rank must be given the same";

}  // namespace stagetools
