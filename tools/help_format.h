// The --help layout of the three commands: CLI11's, except that an option whose name and
// type fill the name column but one character puts its description on the next line, as
// longer ones do. CLI11 would leave a single space there, and help2man (which makes the man
// pages from --help) needs two to tell the option from its description.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace stagetools {

class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string opts = CLI::Formatter::make_option_opts(opt);
    // format_help prefixes two spaces and wraps when the result reaches the column width
    if (2 + make_option_name(opt, false).size() + opts.size() + 1 == get_column_width()) opts += ' ';
    return opts;
  }
};

inline void use_help_format(CLI::App& app) { app.formatter(std::make_shared<HelpFormatter>()); }

}  // namespace stagetools
