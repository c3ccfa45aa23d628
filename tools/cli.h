// How the three commands parse their command line and answer what is not a run: --help and
// --version print to stdout and exit 0; a usage error prints "NAME: why" and "Try 'NAME
// --help'." to stderr and exits with the command's usage status (2; stagefs run: 125). A
// command started on many ranks prints once (`speaks` false on the others) but every rank
// exits the same way. Not thread-safe (called once, first thing in main).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

namespace stagetools {

struct Command {
  std::string name;                                      // begins every error message: "stagefs: ..."
  std::string help_name;                                 // in "Try 'HELP_NAME --help'." ("stagefs run")
  int usage_status = 2;                                  // the exit status of a usage error
  bool speaks = true;                                    // false: print nothing (not the first rank)
  std::function<std::string()> help;                     // --help's text; unset: the app's
  std::function<std::string(const std::string&)> shown;  // how an error's text is shown; unset: as is
};

// Prints "NAME: why\nTry 'HELP_NAME --help'." (if the command speaks) and returns the usage status.
inline int usage_error(const Command& c, const std::string& why) {
  if (c.speaks)
    std::fprintf(stderr, "%s: %s\nTry '%s --help'.\n", c.name.c_str(), (c.shown ? c.shown(why) : why).c_str(),
                 c.help_name.c_str());
  return c.usage_status;
}

// Parses argv into app. Nothing if the command is to run; else the exit status, after --help's
// or --version's text or the usage error has been printed.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv, const Command& c) {
  const auto help = [&] {
    if (c.speaks) std::fputs((c.help ? c.help() : app.help()).c_str(), stdout);
    return 0;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return help();
  } catch (const CLI::CallForAllHelp&) {
    return help();
  } catch (const CLI::CallForVersion& e) {
    if (c.speaks) std::puts(e.what());
    return 0;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return help();
    return usage_error(c, e.what());
  }
  return std::nullopt;
}

}  // namespace stagetools
