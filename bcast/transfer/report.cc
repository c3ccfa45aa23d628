#include "bcast/transfer/report.h"

#include <cstdio>

#include "bcast/text/text.h"

namespace stage {

static double mbps(uint64_t bytes, double secs) {
  return secs > 0 ? static_cast<double>(bytes) / secs / 1e6 : 0.0;
}

std::string report_table(const StageReport& r, const std::string& source, const std::string& dest) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "stage-bcast %s: %s -> %s\n", r.ok ? "done" : "FAILED", source.c_str(),
                dest.c_str());
  out += line;
  std::snprintf(
      line, sizeof line,
      "  %llu file(s), %s; %lld node(s), %lld wrote, %llu file(s) / %s broadcast in %llu chunk(s)\n",
      static_cast<unsigned long long>(r.files), human_bytes(r.bytes_total).c_str(),
      static_cast<long long>(r.writers), static_cast<long long>(r.nodes_written),
      static_cast<unsigned long long>(r.files_streamed), human_bytes(r.bytes_streamed).c_str(),
      static_cast<unsigned long long>(r.chunks));
  out += line;
  if (r.fed_by >= 0) {
    std::snprintf(line, sizeof line,
                  "  Fed by rank %d from %s; read %s from the shared source, %s from seed copies\n", r.fed_by,
                  r.fed_from_copy ? "its current copy (seed)" : "the shared source",
                  human_bytes(r.bytes_read_source).c_str(), human_bytes(r.bytes_read_seed).c_str());
    out += line;
  }
  for (const auto& why : r.feed_failures) {  // each feed that failed and was replaced
    out += "  A failed feed was replaced: " + why + "\n";
  }
  const std::pair<const char*, double> rows[] = {
      {"Topology check", r.t.topology},      {"Source metadata", r.t.metadata},
      {"Pre-validation", r.t.prevalidate},   {"Copy phase", r.t.copy},
      {"Post-validation", r.t.postvalidate}, {"Total time", r.t.total}};
  out += "  Phase              Time (s)\n";
  for (const auto& [name, secs] : rows) {
    std::snprintf(line, sizeof line, "  %-17s %9.4f\n", name, secs);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-17s %9.1f MB/s per node (copy phase)\n", "Bandwidth",
                mbps(r.bytes_streamed, r.t.copy));
  out += line;
  if (r.chunks > 0) {  // where the copy phase went (slowest rank per stage; waits = back-pressure)
    const PipelineTimes& p = r.pipe;
    std::snprintf(
        line, sizeof line,
        "  Pipeline (s, slowest rank): read %.2f (waited %.2f), bcast %.2f, verify %.2f, write %.2f "
        "(waited %.2f), fsync %.2f\n",
        p.read, p.read_wait, p.bcast, p.verify, p.write, p.write_wait, p.sync);
    out += line;
  }
  return out;
}

// JSON string body: UTF-8 passes through; control characters are escaped; bytes that are not
// UTF-8 (paths may hold any byte) become U+FFFD, since JSON text must be UTF-8.
std::string json_escape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (const size_t n = utf8_length(s, i); n > 0) {
        out.append(s, i, n);
        i += n - 1;
      } else {
        out += "\\ufffd";
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string report_json(const StageReport& r, const std::string& source, const std::string& dest, int ranks) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "{\"ok\":%s,\"exit_code\":%d,\"ranks\":%d,\"nodes\":%lld,\"nodes_needing\":%lld,\"nodes_written\":%lld,"
      "\"files\":%llu,\"dirs\":%llu,\"symlinks\":%llu,\"bytes\":%llu,\"bytes_broadcast\":%llu,"
      "\"files_broadcast\":%llu,\"chunks\":%llu,\"fed_by_rank\":%d,\"fed_from\":\"%s\","
      "\"bytes_read_source\":%llu,\"bytes_read_seed\":%llu,\"feed_retries\":%d,"
      "\"seconds\":{\"topology\":%.6f,\"metadata\":%.6f,\"pre_validation\":%.6f,\"copy\":%.6f,"
      "\"post_validation\":%.6f,\"total\":%.6f},\"bandwidth_mb_s\":%.1f,"
      "\"pipeline_seconds\":{\"read\":%.3f,\"read_wait\":%.3f,\"bcast\":%.3f,\"verify\":%.3f,\"write\":%.3f,"
      "\"write_wait\":%.3f,\"sync\":%.3f},",
      r.ok ? "true" : "false", r.exit_code, ranks, static_cast<long long>(r.writers),
      static_cast<long long>(r.nodes_needing), static_cast<long long>(r.nodes_written),
      static_cast<unsigned long long>(r.files), static_cast<unsigned long long>(r.dirs),
      static_cast<unsigned long long>(r.symlinks), static_cast<unsigned long long>(r.bytes_total),
      static_cast<unsigned long long>(r.bytes_streamed), static_cast<unsigned long long>(r.files_streamed),
      static_cast<unsigned long long>(r.chunks), r.fed_by,
      r.fed_by < 0      ? "none"
      : r.fed_from_copy ? "seed"
                        : "source",
      static_cast<unsigned long long>(r.bytes_read_source),
      static_cast<unsigned long long>(r.bytes_read_seed), r.feed_retries, r.t.topology, r.t.metadata,
      r.t.prevalidate, r.t.copy, r.t.postvalidate, r.t.total, mbps(r.bytes_streamed, r.t.copy), r.pipe.read,
      r.pipe.read_wait, r.pipe.bcast, r.pipe.verify, r.pipe.write, r.pipe.write_wait, r.pipe.sync);
  std::string out = buf;
  out += "\"source\":\"" + json_escape(source) + "\",\"dest\":\"" + json_escape(dest) + "\",\"errors\":[";
  for (size_t i = 0; i < r.errors.size(); ++i) out += (i ? ",\"" : "\"") + json_escape(r.errors[i]) + "\"";
  out += "],\"feed_failures\":[";
  for (size_t i = 0; i < r.feed_failures.size(); ++i)
    out += (i ? ",\"" : "\"") + json_escape(r.feed_failures[i]) + "\"";
  out += "],\"skipped\":[";
  for (size_t i = 0; i < r.skipped.size(); ++i) out += (i ? ",\"" : "\"") + json_escape(r.skipped[i]) + "\"";
  out += "]}\n";
  return out;
}

}  // namespace stage
