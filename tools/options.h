// Options bound to the config structs' members, for the three commands: the member's value
// before parsing is the default --help shows (and the man page, made from --help), so each
// default is written once, in its struct. Sizes are read with K/M/G/T (stage::parse_size) and
// shown the same way; a word from a fixed list stands for a value (an enum, on/off). A value
// that does not parse is a usage error "NAME: why" (CLI::ValidationError, exit status 2).
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bcast/chunk.h"
#include "bcast/manifest.h"
#include "bcast/pipeline.h"

namespace stagetools {

// An explanation if the size is out of range, or nothing.
using SizeCheck = std::function<std::optional<std::string>(uint64_t)>;

// `malformed` begins the message for a value that is not a size at all.
inline CLI::Option* add_size(CLI::App& app, const std::string& name, uint64_t& target, const std::string& desc,
                             SizeCheck check = {}, std::string malformed = "not a size") {
  return app
      .add_option_function<std::string>(
          name,
          [t = &target, name, check = std::move(check), malformed = std::move(malformed)](const std::string& text) {
            const auto n = stage::parse_size(text);
            if (!n) throw CLI::ValidationError(name, malformed + ": '" + text + "'");
            if (check)
              if (auto why = check(*n)) throw CLI::ValidationError(name, *why);
            *t = *n;
          },
          desc)
      ->default_str(stage::size_text(target));
}

template <class T>
CLI::Option* add_choice(CLI::App& app, const std::string& name, T& target, std::vector<std::pair<std::string, T>> words,
                        const std::string& desc) {
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

// --bcast-algorithm's words, for both tools: the names bcast/pipeline.h gives the algorithms.
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
