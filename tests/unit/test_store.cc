// PosixStore's write path: direct I/O (O_DIRECT for the aligned part of each write) gives the
// same bytes as buffered writes, and really leaves the page cache alone; the engine hands it
// buffers it can use.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <vector>

#include "bcast/io/buffer.h"
#include "bcast/io/crc.h"
#include "bcast/io/fd.h"
#include "bcast/transfer/engine.h"
#include "fusefs/cache/copy_xattrs.h"
#include "tmpdir.h"

namespace stage::testing {
namespace {

// Fraction of the file's pages that are in the page cache (mincore of a mapping).
double resident_fraction(const std::string& p) {
  Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return -1;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || st.st_size == 0) return -1;
  const size_t len = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) return -1;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  const int rc = ::mincore(m, len, vec.data());
  ::munmap(m, len);
  if (rc != 0) return -1;
  size_t in = 0;
  for (unsigned char v : vec) in += v & 1U;
  return static_cast<double>(in) / static_cast<double>(vec.size());
}

class StoreTest : public TmpDirTest {
 protected:
  // Whether O_DIRECT can be opened here at all, and the page cache is a real cache (tmpfs pages
  // are always resident, so residency says nothing there).
  bool direct_observable() {
    struct statfs sf {};
    if (::statfs(dir_.c_str(), &sf) != 0 || sf.f_type == TMPFS_MAGIC) return false;
    const std::string probe = path("probe");
    Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600));
    ::unlink(probe.c_str());
    return fd.valid();
  }
  // Writes `data` through a Txn in the given pieces (offset, length, misalignment of the
  // buffer), finishes and commits; returns the published file's path.
  std::string write_through(bool direct, const std::string& data,
                            const std::vector<std::array<size_t, 3>>& pieces, const std::string& name) {
    PosixStore store(StoreOptions{.direct_io = direct, .xattrs = stagefs::kCopyXattrs});
    const std::string dest = path(name);
    auto txn = store.begin(dest);
    EXPECT_TRUE(txn) << txn.error().message;
    if (!txn) return dest;
    // One aligned buffer holding the whole file at a chosen misalignment: the piece's bytes
    // start at buf + shift.
    auto mem = ChunkBuffer::make(data.size() + 8192);  // page-aligned
    EXPECT_TRUE(mem);
    if (!mem) return dest;
    auto* buf = reinterpret_cast<char*>(mem->data());
    for (const auto& [off, len, shift] : pieces) {
      std::memcpy(buf + shift, data.data() + off, len);
      auto st = (*txn)->write(off, std::as_bytes(std::span(buf + shift, len)));
      EXPECT_TRUE(st) << st.error().message;
    }
    FileMeta m;
    m.size = data.size();
    m.mode = 0644;
    m.mtime_ns = 1'000'000'000;
    EXPECT_TRUE((*txn)->finish(m, 0, nullptr));
    EXPECT_TRUE((*txn)->sync());
    EXPECT_TRUE((*txn)->commit());
    return dest;
  }
};

TEST_F(StoreTest, DirectAndBufferedWritesGiveTheSameFile) {
  const std::string data = random_bytes(3 * 1024 * 1024 + 777, 11);
  // Offsets, lengths and buffer alignments of every kind: aligned throughout; an unaligned
  // head; an aligned offset with an unaligned length; an aligned offset from a misaligned
  // buffer (must go buffered); the unaligned tail of the file.
  const std::vector<std::array<size_t, 3>> pieces = {
      {0, 1048576, 0},                      // all aligned: direct
      {1048576, 100, 0},                    // shorter than a page: buffered
      {1048676, 500000, 100},               // unaligned head buffered, aligned body direct
      {1548676, 4096 * 10, 0},              // the body's memory misaligned: all buffered
      {1589636, 300000, 388},               // buffered head, direct body, buffered tail
      {1889636, 1048576, 0},                // misaligned memory again
      {2938212, data.size() - 2938212, 0},  // the file's unaligned tail
  };
  for (bool direct : {true, false}) {
    const std::string p = write_through(direct, data, pieces, direct ? "direct.bin" : "buffered.bin");
    EXPECT_EQ(read_file(p), data) << (direct ? "direct" : "buffered");
  }
  // An aligned offset and buffer but a length that ends mid-page (direct body, buffered
  // tail), then the rest of the file from a buffer misaligned by the same amount.
  const std::string small = random_bytes(40 * 4096 + 5, 12);
  const size_t cut = 17 * 4096 + 9;
  const std::string p = write_through(true, small, {{0, cut, 0}, {cut, small.size() - cut, 9}}, "s.bin");
  EXPECT_EQ(read_file(p), small);
}

// A copy whose last bytes were never written (a hole at the end: zero chunks are not
// written) still gets the source's size; one written to its end is not truncated again.
// A temporary file left by an earlier writer with the same name is replaced.
TEST_F(StoreTest, FinishSetsTheSizeOnlyWhereTheWritesStoppedShort) {
  const std::string data = random_bytes(10000, 14);
  const std::string holes =
      write_through(false, data.substr(0, 4096) + std::string(5904, '\0'), {{0, 4096, 0}}, "tail_hole.bin");
  EXPECT_EQ(read_file(holes), data.substr(0, 4096) + std::string(5904, '\0'));
  PosixStore store(StoreOptions{.xattrs = stagefs::kCopyXattrs});
  const std::string dest = path("left.bin");
  std::string temp;
  {
    auto first = store.begin(dest);
    ASSERT_TRUE(first);
    temp = (*first)->temp_path();
  }  // aborted: its temporary file is gone; put one back, as a writer killed mid-copy leaves it
  {
    std::ofstream left(temp);
    left << "the rest of a dead writer's copy";
  }
  ASSERT_TRUE(std::filesystem::exists(temp));
  const std::string full = write_through(false, data, {{0, 6000, 0}, {6000, 4000, 0}}, "left.bin");
  EXPECT_EQ(read_file(full), data);
  EXPECT_FALSE(std::filesystem::exists(temp));
}

TEST_F(StoreTest, DirectWritesSkipThePageCache) {
  if (!direct_observable()) GTEST_SKIP() << "no O_DIRECT, or a tmpfs, under " << dir_;
  const std::string data = random_bytes(8 * 1024 * 1024, 13);
  const std::vector<std::array<size_t, 3>> pieces = {{0, data.size() / 2, 0},
                                                     {data.size() / 2, data.size() / 2, 0}};
  const std::string direct = write_through(true, data, pieces, "direct.bin");
  const std::string buffered = write_through(false, data, pieces, "buffered.bin");
  // Measured before anything reads the files back.
  if (resident_fraction(buffered) < 0.5)  // this filesystem or memory pressure hides the cache
    GTEST_SKIP() << "a buffered copy is not seen in the page cache here: cannot tell";
  EXPECT_LT(resident_fraction(direct), 0.05);
  EXPECT_EQ(read_file(direct), data);
}

TEST_F(StoreTest, EngineBuffersAreUsableForDirectIo) {
  if (!direct_observable()) GTEST_SKIP() << "no O_DIRECT, or a tmpfs, under " << dir_;
  const std::string data = random_bytes(8 * 1024 * 1024, 14);
  write_file(path("src.bin"), data);
  PosixSource src;
  PosixStore store(StoreOptions{.direct_io = true, .xattrs = stagefs::kCopyXattrs});
  SelfComm comm;
  StageOptions opt;
  opt.chunk_size = 1024 * 1024;
  const StageEndpoint ep{path("src.bin"), path("node0/copy.bin"), true};
  const auto rep = stage_transfer(comm, &src, store, opt, ep);
  ASSERT_TRUE(rep.ok) << (rep.errors.empty() ? "" : rep.errors[0]);
  // Only a page-aligned chunk buffer lets the writer use O_DIRECT; a vector's data is not.
  EXPECT_LT(resident_fraction(path("node0/copy.bin")), 0.05);
  EXPECT_EQ(read_file(path("node0/copy.bin")), data);
}

// A field ("THPeligible", "AnonHugePages", ...) of the mapping of this process that holds p.
long smaps_field(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind(field + ":", 0) == 0)
      return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
  }
  return -1;
}

// A copy's chunk record: one CRC per chunk, coarser power-of-two units past kMaxRecordUnits
// chunks (so that it fits one xattr block), and it proves only streams whose chunk size and
// its unit divide one another, of this size and whole-file CRC.
TEST(ChunkRecordTest, CoarserUnitsPastTheLimitAndProofsOnlyForDividingChunkSizes) {
  const uint64_t chunk = 4096;
  const std::string data = [] {
    std::string d(1000 * 4096 + 123, '\0');
    for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<char>(i * 2654435761U >> 24);
    return d;
  }();
  std::vector<uint64_t> chunk_crcs;
  for (uint64_t off = 0; off < data.size(); off += chunk)
    chunk_crcs.push_back(
        crc64(std::as_bytes(std::span(data.data() + off, std::min<uint64_t>(chunk, data.size() - off)))));
  const uint64_t whole = crc64(std::as_bytes(std::span(data.data(), data.size())));
  const ChunkRecord r = make_chunk_record(chunk_crcs, chunk, data.size());
  EXPECT_EQ(r.unit, 4 * chunk);  // 1001 chunks: 251 units of 4 chunks
  EXPECT_LE(r.crcs.size(), kMaxRecordUnits);
  EXPECT_LE(encode_chunk_record(r).size(), 3200U);
  auto back = decode_chunk_record(encode_chunk_record(r));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->unit, r.unit);
  EXPECT_EQ(back->crcs, r.crcs);
  EXPECT_TRUE(r.proves(chunk, data.size(), whole));
  EXPECT_TRUE(r.proves(16 * chunk, data.size(), whole));
  EXPECT_FALSE(r.proves(3 * chunk, data.size(), whole)) << "neither divides the other";
  EXPECT_FALSE(r.proves(chunk, data.size(), whole ^ 1)) << "a record of other bytes";
  EXPECT_FALSE(r.proves(chunk, data.size() + 1, whole)) << "a record of another size";
  EXPECT_FALSE(decode_chunk_record(encode_chunk_record(r).substr(0, 100)));
}

// A temporary copy finished (its mode the source's, read-only here) and then written again,
// as a transfer fed again after a failed seed does, by a writer that is not root: it can be
// emptied and written again, and its chunk record is what it recorded last.
TEST_F(StoreTest, AFinishedCopyCanBeWrittenAgainByAWriterThatIsNotRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  const std::string dir = path("user");
  ASSERT_EQ(::chmod(dir_.c_str(), 0711), 0);  // nobody may pass through the test's directory
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), 65534, 65534), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // the child: nobody, writing a copy of a 0444 source twice
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    PosixStore store{StoreOptions{.xattrs = stagefs::kCopyXattrs}};
    auto txn = store.begin(dir + "/copy");
    if (!txn) ::_exit(3);
    FileMeta m{8192, 1'000'000'000, 1, 1, 1, 0444};
    const std::string a(8192, 'a'), b(8192, 'b');
    const std::vector<uint64_t> crcs{crc64(std::as_bytes(std::span(b.data(), 4096))),
                                     crc64(std::as_bytes(std::span(b.data(), 4096)))};
    const ChunkRecord rec = make_chunk_record(crcs, 4096, 8192);
    if (auto st = (*txn)->write(0, std::as_bytes(std::span(a))); !st) ::_exit(4);
    if (auto st = (*txn)->finish(m, 0, nullptr); !st) {
      std::fprintf(stderr, "%s\n", st.error().message.c_str());
      ::_exit(9);
    }
    if (!(*txn)->rewind()) ::_exit(5);
    if (!(*txn)->write(0, std::as_bytes(std::span(b))) || !(*txn)->finish(m, 0, &rec)) ::_exit(6);
    if (!(*txn)->commit()) ::_exit(7);
    auto got = store.chunk_record(dir + "/copy");
    ::_exit(got && *got && (*got)->chunks.crcs == rec.crcs ? 0 : 8);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the step that failed (see the child's exit codes)";
  EXPECT_TRUE(read_file(dir + "/copy") == std::string(8192, 'b'));
  struct stat st {};
  ASSERT_EQ(::stat((dir + "/copy").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0444U);
}

TEST(ChunkBuffer, AlignedForDirectIoAndHugePages) {
  for (uint64_t size : {uint64_t{1}, uint64_t{4096}, uint64_t{65537}, uint64_t{16} << 20U}) {
    auto b = ChunkBuffer::make(size);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->size(), size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % (size >= kHugePage ? kHugePage : kDirectAlign), 0U);
  }
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::stringstream mode;
  mode << thp.rdbuf();
  if (!thp || mode.str().find("[never]") != std::string::npos) GTEST_SKIP() << "transparent huge pages off";
  auto b = ChunkBuffer::make(uint64_t{16} << 20U);
  ASSERT_TRUE(b);
  std::memset(b->data(), 1, b->size());  // what the reader or MPI does to it
  // Eligibility is what the buffer controls (under THP "madvise" only advised memory is
  // eligible); whether the kernel found free huge pages just then is the machine's business.
  EXPECT_EQ(smaps_field(b->data(), "THPeligible"), 1)
      << "a 16 MiB chunk buffer may not use huge pages (THP " << mode.str() << ")";
  if (smaps_field(b->data(), "AnonHugePages") <= 0)
    std::printf("note: no huge page was available for the buffer just now (fragmented memory?)\n");
}

}  // namespace
}  // namespace stage::testing
