// The pure side of the data path's broadcasts (bcast/transfer/pipeline.h): algorithm names, the
// broadcast order and each rank's links in it, the segment size, and what an algorithm means
// for a buffer on a Comm. No messages: unit-tested on their own.
#include <algorithm>
#include <cctype>
#include <numeric>

#include "bcast/transfer/pipeline.h"

namespace stage {

std::optional<BcastAlgorithm> parse_bcast_algorithm(std::string_view text) {
  if (text == "auto") return BcastAlgorithm::automatic;
  if (text == "chain") return BcastAlgorithm::chain;
  if (text == "tree") return BcastAlgorithm::tree;
  if (text == "mpi") return BcastAlgorithm::mpi;
  return std::nullopt;
}

const char* to_string(BcastAlgorithm a) {
  switch (a) {
    case BcastAlgorithm::automatic:
      return "auto";
    case BcastAlgorithm::chain:
      return "chain";
    case BcastAlgorithm::tree:
      return "tree";
    case BcastAlgorithm::mpi:
      return "mpi";
  }
  return "?";
}

namespace {

// "node9" < "node10": runs of digits compare as numbers, so numbered hosts and switches keep
// their natural neighbours next to each other.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const auto da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const auto db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie])) != 0) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je])) != 0) ++je;
      size_t is = i, js = j;  // skip leading zeros, then the longer number is bigger
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      if (int c = a.compare(is, ie - is, b, js, je - js); c != 0) return c < 0;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::vector<int> broadcast_order(const std::vector<std::string>& placement, int root) {
  const int n = static_cast<int>(placement.size());
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return natural_less(placement[static_cast<size_t>(a)], placement[static_cast<size_t>(b)]);
  });
  auto it = std::find(order.begin(), order.end(), root);
  if (it != order.end()) std::rotate(order.begin(), it, order.end());
  return order;
}

Links links_of(BcastAlgorithm shape, const std::vector<int>& order, int rank) {
  Links l;
  const auto it = std::find(order.begin(), order.end(), rank);
  if (it == order.end()) return l;
  const size_t p = static_cast<size_t>(it - order.begin());
  const size_t n = order.size();
  if (shape == BcastAlgorithm::tree) {
    if (p > 0) l.parent = order[(p - 1) / 2];
    for (size_t c : {2 * p + 1, 2 * p + 2})
      if (c < n) l.children.push_back(order[c]);
  } else {
    if (p > 0) l.parent = order[p - 1];
    if (p + 1 < n) l.children.push_back(order[p + 1]);
  }
  return l;
}

uint64_t segment_for(uint64_t bytes) {
  return std::max<uint64_t>(1, std::min(bytes, kDefaultSegment));
}

BcastAlgorithm resolve(BcastAlgorithm requested, Comm& comm, uint64_t bytes) {
  if (requested == BcastAlgorithm::mpi || comm.size() <= 1 || comm.point_to_point() == nullptr)
    return BcastAlgorithm::mpi;
  if (requested != BcastAlgorithm::automatic) return requested;
  return bytes > kPipelineMinBytes ? BcastAlgorithm::chain : BcastAlgorithm::mpi;
}

}  // namespace stage
