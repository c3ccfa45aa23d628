#include "fusefs/run/site.h"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

namespace stagefs::run {

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// A value as a shell would read it from one word: bare, or in matching quotes.
bool unquote(std::string_view v, std::string& out) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    v = v.substr(1, v.size() - 2);
    if (v.find(v.front() == '"' ? '"' : '\'') != std::string_view::npos) return false;
  } else if (v.find_first_of("\"'` \t$\\;&|<>(){}") != std::string_view::npos) {
    return false;  // a shell would read something else than this text
  }
  out.assign(v);
  return true;
}

// A refusal whose message is the whole story (no host, no strerror).
stage::Error refusal(std::string message) {
  return stage::Error{std::error_code(EINVAL, std::generic_category()), std::move(message)};
}

// The keys of the admin kit's scripts only (packaging/admin/): known, not used here.
constexpr std::string_view kKitKeys[] = {"STAGEFS_FUSE_MODE", "STAGEFS_PURGE_AFTER_DAYS",
                                         "STAGEFS_PURGE_ABOVE"};

}  // namespace

stage::Result<SiteConfig> parse_site_config(std::string_view text, const std::string& origin) {
  SiteConfig cfg;
  int number = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++number;
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = origin + ":" + std::to_string(number);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return refusal(where + ": not a KEY=VALUE line: '" + std::string(line) + "'");
    const std::string_view key = line.substr(0, eq);
    std::string value;
    if (!unquote(line.substr(eq + 1), value))
      return refusal(where + ": " + std::string(key) +
                     ": a value is one word, bare or quoted, with nothing to expand");
    if (key == "STAGEFS_MOUNT") {
      cfg.mount = value;
    } else if (key == "STAGEFS_CACHE") {
      cfg.cache = value;
    } else if (key == "STAGEFS_CACHE_SIZE") {
      cfg.cache_size = value;
    } else if (key == "STAGEFS_SPARE_CACHES") {
      cfg.spare_caches = value;
    } else if (std::find(std::begin(kKitKeys), std::end(kKitKeys), key) == std::end(kKitKeys)) {
      cfg.warnings.push_back(where + ": unknown key " + std::string(key) + " (ignored)");
    }
  }
  return cfg;
}

stage::Result<SiteConfig> load_site_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return SiteConfig{};
    return stage::sys_error(errno, "site settings", path);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_site_config(text.str(), path);
}

stage::Result<std::string> expand_pattern(std::string_view pattern, const PatternValues& v) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%') {
      out.push_back(pattern[i]);
      continue;
    }
    const char code = i + 1 < pattern.size() ? pattern[++i] : '\0';
    std::string value;
    switch (code) {
      case '%':
        out.push_back('%');
        continue;
      case 'j':
        value = v.job_id;
        break;
      case 'u':
        value = v.user;
        break;
      case 'U':
        value = std::to_string(v.uid);
        break;
      default:
        return refusal(std::string(pattern) + ": unknown code %" + std::string(1, code) +
                       " (known: %j %u %U %%)");
    }
    if (value.empty() || value == "." || value == ".." || value.find('/') != std::string::npos)
      return refusal(std::string(pattern) + ": %" + std::string(1, code) + " would be '" + value +
                     "', not a directory name");
    out += value;
  }
  return out;
}

}  // namespace stagefs::run
