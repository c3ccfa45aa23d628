// The source and the store a tool hands a transfer, and the one hook through which the tool
// may wrap them first: the crash tests' hold points (bcast/holds/holds.h), which only the
// tools link. A library of the product takes a SeamWrapper from its tool and never names what
// wraps. Not thread-safe: built once, before the transfers start.
#pragma once

#include <functional>
#include <memory>

#include "bcast/io/source.h"
#include "bcast/io/store.h"

namespace stage {

class Seams {
 public:
  virtual ~Seams() = default;
  virtual LocalStore& store() = 0;
  virtual SourceReader& source() = 0;
};

// Given the store, the source (both outlive what it returns) and this rank: the seams to use.
using SeamWrapper = std::function<std::unique_ptr<Seams>(LocalStore&, SourceReader&, int rank)>;

// What `wrap` gives, or the store and source themselves when `wrap` is empty.
inline std::unique_ptr<Seams> wrap_seams(const SeamWrapper& wrap, LocalStore& store, SourceReader& source,
                                         int rank) {
  if (wrap) return wrap(store, source, rank);
  class Plain final : public Seams {
   public:
    Plain(LocalStore& st, SourceReader& src) : store_(st), source_(src) {}
    LocalStore& store() override { return store_; }
    SourceReader& source() override { return source_; }

   private:
    LocalStore& store_;
    SourceReader& source_;
  };
  return std::make_unique<Plain>(store, source);
}

}  // namespace stage
