// Pure parts of the core: chunk arithmetic, CRC-64 and its combination, the manifest codec,
// the stream layout and the pre-validation decision; the status JSON and the daemon log.
#include <gtest/gtest.h>

#include <climits>
#include <random>

#include <spdlog/spdlog.h>

#include "bcast/io/chunk.h"
#include "bcast/io/crc.h"
#include "bcast/transfer/engine.h"
#include "bcast/job/job.h"
#include "bcast/io/manifest.h"
#include "bcast/transfer/layout.h"
#include "fusefs/base/log.h"
#include "fusefs/edge/status.h"

namespace stage {
namespace {

TEST(Chunk, CountAndRanges) {
  EXPECT_EQ(chunk_count(0, 16), 0U);
  EXPECT_EQ(chunk_count(1, 16), 1U);
  EXPECT_EQ(chunk_count(16, 16), 1U);
  EXPECT_EQ(chunk_count(17, 16), 2U);
  const uint64_t five_gib = 5ULL << 30;
  EXPECT_EQ(chunk_count(five_gib, kMaxChunk), 5U);
  auto last = chunk_range(1000003, 65536, chunk_count(1000003, 65536) - 1);
  EXPECT_EQ(last.offset + last.length, 1000003U);
  EXPECT_LT(last.length, 65536U);
  EXPECT_EQ(chunk_range(100, 16, 7).length, 0U);  // past the end
}

TEST(Chunk, MpiPiecesStayUnderIntMax) {
  EXPECT_EQ(mpi_piece(10), 10);
  EXPECT_EQ(mpi_piece(5ULL << 30), 1 << 30);
  EXPECT_LE(static_cast<uint64_t>(mpi_piece(UINT64_MAX)), static_cast<uint64_t>(INT_MAX));
}

TEST(Chunk, Overlap) {
  EXPECT_EQ(overlap(0, 10, 5, 10).offset, 5U);
  EXPECT_EQ(overlap(0, 10, 5, 10).length, 5U);
  EXPECT_EQ(overlap(0, 10, 10, 10).length, 0U);
  EXPECT_EQ(overlap(3, 2, 0, 100).length, 2U);
}

// How --help shows a default size: the largest exact unit, read back to the same bytes.
TEST(Chunk, SizeTextIsParseSizesInverse) {
  EXPECT_EQ(size_text(16 * kMiB), "16M");
  EXPECT_EQ(size_text(uint64_t{256} << 20), "256M");
  EXPECT_EQ(size_text(1ULL << 30), "1G");
  EXPECT_EQ(size_text(4096), "4K");
  EXPECT_EQ(size_text(1000), "1000");
  EXPECT_EQ(size_text(0), "0");
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, kMiB + 1, uint64_t{3} << 40, 5 * kMiB})
    EXPECT_EQ(parse_size(size_text(n)), n) << n;
}

// stage-bcast's --dest pattern, per rank.
TEST(BcastJob, ExpandsDestPattern) {
  EXPECT_EQ(expand_dest("/t/node%n/img.%r", 5, 2, "h1"), "/t/node2/img.5");
  EXPECT_EQ(expand_dest("/t/%h/100%%/%x%", 0, 0, "host"), "/t/host/100%/%x%");
  EXPECT_EQ(expand_dest("plain", 1, 1, "h"), "plain");
}

TEST(Chunk, ParseSize) {
  EXPECT_EQ(parse_size("4096"), 4096U);
  EXPECT_EQ(parse_size("16M"), 16U << 20);
  EXPECT_EQ(parse_size("1GiB"), 1ULL << 30);
  EXPECT_EQ(parse_size("512k"), 512U << 10);
  EXPECT_FALSE(parse_size(""));
  EXPECT_FALSE(parse_size("abc"));
  EXPECT_FALSE(parse_size("-1"));
  EXPECT_FALSE(parse_size("12Q"));
  EXPECT_FALSE(parse_size("99999999999999999999999"));
  EXPECT_FALSE(parse_size("17179869184T"));  // overflows
  EXPECT_TRUE(check_chunk_size(0).has_value());
  EXPECT_TRUE(check_chunk_size(5ULL << 30).has_value());
  EXPECT_FALSE(check_chunk_size(kDefaultChunk).has_value());
}

std::vector<std::byte> bytes_of(const std::string& s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

TEST(Crc, CheckValueOfCrc64Xz) {
  const auto b = bytes_of("123456789");
  EXPECT_EQ(crc64(b), 0x995dc9bbdf1939faULL);
}

TEST(Crc, CombineEqualsDirect) {
  std::mt19937_64 g(7);
  std::vector<std::byte> data(100000);
  for (auto& x : data) x = static_cast<std::byte>(g());
  const uint64_t whole = crc64(data);
  for (size_t split : {size_t{0}, size_t{1}, size_t{4095}, size_t{65536}, size_t{99999}, data.size()}) {
    const std::span<const std::byte> a(data.data(), split);
    const std::span<const std::byte> b(data.data() + split, data.size() - split);
    EXPECT_EQ(crc64_combine(crc64(a), crc64(b), b.size()), whole) << "split at " << split;
    EXPECT_EQ(crc64(b, crc64(a)), whole);  // incremental, for comparison
  }
}

TEST(Crc, ZerosEqualsDirect) {
  for (uint64_t n : {0ULL, 1ULL, 65535ULL, 65536ULL, 65537ULL, 1000003ULL, 3ULL << 20}) {
    std::vector<std::byte> z(n);
    EXPECT_EQ(crc64_zeros(n), crc64(z)) << n;
  }
}

Manifest sample_tree() {
  Manifest m;
  m.tree = true;
  m.entries.push_back({"", EntryType::dir, {0, 1, 2, 3, 4, 0755}, {}});
  m.entries.push_back({"a", EntryType::dir, {0, 1, 2, 3, 4, 0750}, {}});
  m.entries.push_back({"a/f", EntryType::file, {123, 5, 6, 7, 8, 0644}, {}});
  m.entries.push_back({"link", EntryType::symlink, {0, 1, 2, 3, 4, 0777}, "a/f"});
  return m;
}

TEST(Manifest, RoundTrip) {
  Manifest m = sample_tree();
  m.chunk_size = 4 * kMiB;
  const std::string wire = encode(m);
  auto back = decode(std::as_bytes(std::span(wire.data(), wire.size())));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->chunk_size, 4 * kMiB);  // the source rank's, for every rank
  ASSERT_EQ(back->entries.size(), m.entries.size());
  EXPECT_EQ(back->entries[2].meta, m.entries[2].meta);
  EXPECT_EQ(back->entries[3].link_target, "a/f");
}

Result<Manifest> decode_str(const std::string& s) {
  return decode(std::as_bytes(std::span(s.data(), s.size())));
}

TEST(Manifest, RejectsUnsafeOrMalformed) {
  for (const char* bad : {"../x", "/etc/passwd", "a/../../x", "a//b", "./a", "a/."}) {
    Manifest m = sample_tree();
    m.entries[2].path = bad;
    EXPECT_FALSE(decode_str(encode(m))) << bad;
  }
  for (uint64_t chunk : {uint64_t{0}, uint64_t{100}, kMaxChunk + 1}) {
    Manifest m = sample_tree();
    m.chunk_size = chunk;
    EXPECT_FALSE(decode_str(encode(m))) << "chunk size " << chunk;
  }
  Manifest m = sample_tree();
  m.entries.push_back({"link/escape", EntryType::file, {1, 0, 0, 0, 0, 0644}, {}});  // under a symlink
  EXPECT_FALSE(decode_str(encode(m)));
  const std::string wire = encode(sample_tree());
  for (size_t cut = 0; cut < wire.size(); ++cut) EXPECT_FALSE(decode_str(wire.substr(0, cut))) << cut;
  EXPECT_FALSE(decode_str(wire + "x"));
}

// A sparse file's holes travel in the manifest; decode() takes only holes that are in
// order, disjoint, inside the file and whole chunks (or a last chunk's tail).
TEST(Manifest, HolesRoundTripAndMisfitHolesAreRefused) {
  constexpr uint64_t kChunk = 64 * 1024;
  Manifest m = sample_tree();
  m.chunk_size = kChunk;
  Entry& f = m.entries[2];
  f.meta.size = 10 * kChunk + 100;
  f.holes = {{0, 2 * kChunk}, {4 * kChunk, 3 * kChunk}, {10 * kChunk, 100}};
  auto back = decode_str(encode(m));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_EQ(back->entries[2].holes, f.holes);
  EXPECT_EQ(streamed_bytes(back->entries[2]), 5 * kChunk);
  const std::vector<std::vector<Extent>> misfits = {
      {{kChunk, 0}},                                 // empty
      {{100, kChunk}},                               // not on a chunk boundary
      {{0, kChunk + 1}},                             // ends inside a chunk that is not the last
      {{4 * kChunk, kChunk}, {2 * kChunk, kChunk}},  // out of order
      {{0, 2 * kChunk}, {kChunk, 2 * kChunk}},       // overlapping
      {{10 * kChunk, kChunk}},                       // past the end
      {{UINT64_MAX - kChunk + 1, kChunk}},           // wraps
  };
  for (const auto& holes : misfits) {
    Manifest bad = m;
    bad.entries[2].holes = holes;
    EXPECT_FALSE(decode_str(encode(bad))) << holes[0].off << "+" << holes[0].len;
  }
  Manifest on_dir = m;  // only regular files have holes
  on_dir.entries[1].holes = {{0, kChunk}};
  EXPECT_FALSE(decode_str(encode(on_dir)));
  Manifest many = m;
  many.entries[2].meta.size = uint64_t{1} << 40;
  many.entries[2].holes.clear();
  for (uint64_t k = 0; k < (uint64_t{1} << 20) + 1; ++k)
    many.entries[2].holes.push_back({2 * k * kChunk, kChunk});
  EXPECT_FALSE(decode_str(encode(many))) << "more holes than one manifest may list";
}

TEST(Manifest, RandomBytesNeverCrash) {
  std::mt19937 g(1);
  const std::string wire = encode(sample_tree());
  for (int i = 0; i < 2000; ++i) {
    std::string w = wire;
    for (int k = 0; k < 3; ++k) w[g() % w.size()] = static_cast<char>(g());
    (void)decode_str(w);  // may or may not decode; must not crash or over-read (ASan)
  }
}

TEST(Layout, PiecesPackSmallFilesAndSkipUnneeded) {
  Manifest m;
  m.tree = true;
  m.entries.push_back({"", EntryType::dir, {}, {}});
  for (uint64_t sz : {10ULL, 0ULL, 30ULL, 100ULL})
    m.entries.push_back({std::string("f").append(std::to_string(sz)), EntryType::file, {sz, 0, 0, 0, 0, 0644}, {}});
  const Layout all(m, {1, 1, 1, 1, 1});
  EXPECT_EQ(all.bytes(), 140U);
  auto p = all.pieces(0, 64);  // 10 bytes of f10, all of f30, 24 bytes of f100
  ASSERT_EQ(p.size(), 3U);
  EXPECT_EQ(all.segments()[p[0].segment].entry, 1U);
  EXPECT_EQ(p[1].chunk_off, 10U);
  EXPECT_EQ(p[2].length, 24U);
  EXPECT_EQ(p[2].file_off, 0U);
  auto q = all.pieces(64, 64);
  ASSERT_EQ(q.size(), 1U);
  EXPECT_EQ(q[0].file_off, 24U);
  const Layout some(m, {0, 0, 0, 1, 1});  // only f30 and f100 needed by anyone
  EXPECT_EQ(some.bytes(), 130U);
  EXPECT_EQ(some.segments()[0].entry, 3U);
}

// A sparse file's holes are not in the stream: its runs are back to back, each piece says
// which hole comes before it and whether it ends the file, so the file's CRC (zeros included)
// comes out of the pieces; each stream chunk is one chunk of the file.
TEST(Layout, HolesAreSkippedAndTheFilesCrcKeepsThem) {
  constexpr uint64_t kChunk = 16;
  Manifest m;
  m.chunk_size = kChunk;
  Entry e{"", EntryType::file, {10 * kChunk + 5, 0, 0, 0, 0, 0644}, {}, 0};
  e.holes = {{0, 2 * kChunk}, {3 * kChunk, 4 * kChunk}, {9 * kChunk, kChunk + 5}};
  m.entries.push_back(e);
  const Layout l(m, {1});
  ASSERT_EQ(l.segments().size(), 1U);
  EXPECT_EQ(l.bytes(), 3 * kChunk);  // file chunks 2, 7 and 8
  EXPECT_EQ(l.segments()[0].hole_after, kChunk + 5);
  EXPECT_TRUE(l.one_file_in_chunks(kChunk));
  EXPECT_FALSE(l.one_file_in_chunks(kChunk * 2));
  EXPECT_EQ(l.file_chunk(0, kChunk), 2U);
  EXPECT_EQ(l.file_chunk(1, kChunk), 7U);
  EXPECT_EQ(l.file_chunk(2, kChunk), 8U);
  EXPECT_EQ(l.stream_chunk(7, kChunk), 1U);
  EXPECT_FALSE(l.stream_chunk(0, kChunk));
  EXPECT_FALSE(l.stream_chunk(5, kChunk));
  EXPECT_FALSE(l.stream_chunk(10, kChunk));
  const auto p = l.pieces(0, 3 * kChunk);
  ASSERT_EQ(p.size(), 2U);
  EXPECT_EQ(p[0].file_off, 2 * kChunk);
  EXPECT_EQ(p[0].hole_before, 2 * kChunk);
  EXPECT_FALSE(p[0].ends_file);
  EXPECT_EQ(p[1].file_off, 7 * kChunk);
  EXPECT_EQ(p[1].chunk_off, kChunk);
  EXPECT_EQ(p[1].hole_before, 4 * kChunk);
  EXPECT_TRUE(p[1].ends_file);
  // The file's bytes: data only in the streamed chunks.
  std::string file(e.meta.size, '\0');
  for (uint64_t c : {2U, 7U, 8U})
    for (uint64_t i = 0; i < kChunk; ++i) file[c * kChunk + i] = static_cast<char>('a' + c + i);
  const uint64_t whole = crc64(std::as_bytes(std::span(file.data(), file.size())));
  uint64_t by_pieces = 0;
  for (const Piece& q : l.pieces(0, l.bytes())) {
    const auto bytes = std::as_bytes(std::span(file.data() + q.file_off, q.length));
    by_pieces = crc_through(by_pieces, q, crc64(bytes), l.segments()[q.segment]);
  }
  EXPECT_EQ(by_pieces, whole);
  std::vector<uint64_t> chunk_crc;
  for (uint64_t k = 0; k < 3; ++k)
    chunk_crc.push_back(
        crc64(std::as_bytes(std::span(file.data() + l.file_chunk(k, kChunk) * kChunk, kChunk))));
  EXPECT_EQ(l.crc_of_chunks(kChunk, chunk_crc), whole);
  // A file that is all hole has nothing in the stream.
  Manifest empty;
  empty.chunk_size = kChunk;
  Entry z{"", EntryType::file, {4 * kChunk, 0, 0, 0, 0, 0644}, {}, 0};
  z.holes = {{0, 4 * kChunk}};
  empty.entries.push_back(z);
  const Layout lz(empty, {1});
  EXPECT_EQ(lz.bytes(), 0U);
  EXPECT_TRUE(lz.pieces(0, kChunk).empty());
  EXPECT_EQ(lz.crc_of_chunks(kChunk, {}), crc64_zeros(4 * kChunk));
}

TEST(Decision, PreValidation) {
  const FileMeta src{100, 5, 6, 7, 8, 0644};
  LocalState missing;
  LocalState same{true, true, false, 100, 5, 0, 0, {}, {}};
  LocalState stale_mtime{true, true, false, 100, 4, 0, 0, {}, {}};
  LocalState other_size{true, true, false, 99, 5, 0, 0, {}, {}};
  EXPECT_TRUE(needs_copy(missing, src, Validate::size, false, 0, 0));
  EXPECT_FALSE(needs_copy(same, src, Validate::size, false, 0, 0));
  EXPECT_TRUE(needs_copy(stale_mtime, src, Validate::size, false, 0, 0));  // same size, changed
  EXPECT_TRUE(needs_copy(other_size, src, Validate::size, false, 0, 0));
  EXPECT_TRUE(needs_copy(same, src, Validate::none, false, 0, 0));
  EXPECT_TRUE(needs_copy(same, src, Validate::size, true, 0, 0));
  EXPECT_FALSE(needs_copy(stale_mtime, src, Validate::checksum, false, 42, 42));
  EXPECT_TRUE(needs_copy(same, src, Validate::checksum, false, 41, 42));
}

TEST(Errors, ErrnoTable) {
  EXPECT_EQ(sys_error(ENOENT, "x").to_errno(), ENOENT);
  EXPECT_EQ(stage_error(Errc::checksum_mismatch, "x").to_errno(), EIO);
  EXPECT_EQ(stage_error(Errc::timed_out, "x").to_errno(), ETIMEDOUT);
  EXPECT_NE(sys_error(ENOSPC, "write", "/nvme/x").message.find("/nvme/x"), std::string::npos);
  EXPECT_NE(sys_error(ENOSPC, "write", "/nvme/x").message.find(host_name()), std::string::npos);
}

// A file name is bytes: a transfer of one that is not UTF-8 must not make user.stagefs.status
// (and with it stagectl status, stats and the metrics) fail while it runs.
TEST(Status, ANameThatIsNotUtf8IsShownNotRefused) {
  stagefs::MountStatus s;
  s.current = "data/\xff\xfe-shard.bin";
  s.cache_dir = "/nvme/\xc3";  // a truncated sequence
  std::string j;
  ASSERT_NO_THROW(j = stagefs::to_json(s));
  EXPECT_NE(j.find("data/\xef\xbf\xbd"), std::string::npos) << j;  // U+FFFD in UTF-8
  EXPECT_NE(j.find("-shard.bin"), std::string::npos) << j;
}

// What stagectl prints and the daemon logs of a name: text stays text; whatever a terminal
// would act on, and bytes that are not UTF-8, become \xNN.
TEST(Text, EscapeControlsKeepsTextAndEscapesWhatActsOnATerminal) {
  using stagefs::escape_controls;
  EXPECT_EQ(escape_controls("caf\xc3\xa9/\xe6\x95\xb0\xe6\x8d\xae/\xf0\x9f\x93\xa6.bin"),
            "caf\xc3\xa9/\xe6\x95\xb0\xe6\x8d\xae/\xf0\x9f\x93\xa6.bin");  // UTF-8 unchanged
  // A carriage return, an OSC that sets the window title, DEL.
  EXPECT_EQ(escape_controls("a\r\x1b]0;owned\x07\x7f"), "a\\x0d\\x1b]0;owned\\x07\\x7f");
  // C1 controls in UTF-8 (U+009B is CSI), bidirectional overrides and isolates.
  EXPECT_EQ(escape_controls(std::string("\xc2\x9b") + "31m"), "\\xc2\\x9b31m");
  EXPECT_EQ(escape_controls("x\xe2\x80\xaegnp.exe"), "x\\xe2\\x80\\xaegnp.exe");
  EXPECT_EQ(escape_controls("\xe2\x81\xa6i"), "\\xe2\\x81\\xa6i");
  EXPECT_EQ(escape_controls("\xc2\xa0"), "\xc2\xa0");  // U+00A0, past the C1 range: text
  // Not UTF-8: a stray byte, a truncated sequence, an overlong slash, a surrogate.
  EXPECT_EQ(escape_controls("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(escape_controls("ab\xe6\x95"), "ab\\xe6\\x95");
  EXPECT_EQ(escape_controls("\xc0\xaf"), "\\xc0\\xaf");
  EXPECT_EQ(escape_controls("\xed\xa0\x80"), "\\xed\\xa0\\x80");
  EXPECT_EQ(escape_controls("\\x41"), "\\\\x41");  // a backslash stays unambiguous
  EXPECT_EQ(escape_controls(std::string_view("a\0b", 3)), "a\\x00b");
}

// A file name with a newline must not forge a log line of the root daemon.
TEST(Log, ControlCharactersInAMessageAreEscaped) {
  EXPECT_EQ(stagefs::escape_controls("a/b c.bin"), "a/b c.bin");
  EXPECT_EQ(stagefs::escape_controls("x\n[stagefs r0] info: fake\x1b[2J\\"),
            "x\\x0a[stagefs r0] info: fake\\x1b[2J\\\\");
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  spdlog::logger log("t", stagefs::escaping_sink(f));
  log.set_pattern("%l: %v");
  log.warn("open {}: permission denied", "evil\nwarning: forged line");
  std::rewind(f);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "warning: open evil\\x0awarning: forged line: permission denied\n");
}

// Lines users can cause at will: a burst per cause per window, then a count of what was held
// back, said by the cause's next line or, once it went quiet, by the report.
TEST(Log, EachCauseHasItsBurstAndSaysHowManyWereHeldBack) {
  using namespace std::chrono_literals;
  stagefs::LogLimits b(3, 10s);
  const auto t0 = stagefs::LogLimits::Clock::time_point{} + 100s;
  uint64_t held = 99;
  int allowed = 0;
  for (int i = 0; i < 10; ++i)
    allowed += b.allow("a", "cause a", t0 + std::chrono::milliseconds(i), held) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  EXPECT_TRUE(b.allow("b", "cause b", t0 + 1s, held));  // another cause has its own burst
  EXPECT_EQ(held, 0U);
  EXPECT_FALSE(b.allow("a", "cause a", t0 + 9s, held));
  EXPECT_TRUE(b.quiet(t0 + 9s).empty());                 // a's window is still open
  EXPECT_TRUE(b.allow("a", "cause a", t0 + 10s, held));  // the next window
  EXPECT_EQ(held, 8U);
  EXPECT_TRUE(b.allow("a", "cause a", t0 + 10s, held));
  EXPECT_EQ(held, 0U);
  for (int i = 0; i < 5; ++i) b.allow("a", "cause a", t0 + 11s, held);  // 1 more allowed, 4 held
  const auto q = b.quiet(t0 + 20s);                                     // a went quiet: reported once
  ASSERT_EQ(q.size(), 1U);
  EXPECT_EQ(q[0].shown, "cause a");
  EXPECT_EQ(q[0].lines, 4U);
  EXPECT_TRUE(b.quiet(t0 + 30s, true).empty());
  EXPECT_EQ(stagefs::site_name("materialize {} failed: {:.3f}", "/src/x/fusefs/group/group.cc", 355),
            "materialize ... failed: ... (fusefs/group/group.cc:355)");
}

}  // namespace
}  // namespace stage
