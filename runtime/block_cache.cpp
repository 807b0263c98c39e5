// gnnc's block cache: torch's CPU allocator, keeping freed blocks of 1 MiB and more for the next
// allocation of about their size (gnnc.runtime.block_cache says why). Built and loaded by that module;
// plain C entry points for ctypes.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* base, size_t min_bytes, size_t max_slack)
      : base_(base), min_bytes_(min_bytes), max_slack_(max_slack) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes < min_bytes_) {
      // torch's allocator makes it, and gets it back through this allocator's deleter: raw_deleter()'s
      // contract is that every DataPtr allocate() returns carries it (raw_deallocate relies on that)
      void* data = base_->raw_allocate(nbytes);
      return {data, data, &BlockCache::release, c10::Device(c10::DeviceType::CPU)};
    }
    const size_t want = (nbytes + kPage - 1) & ~(kPage - 1);
    std::vector<void*> evicted;
    void* data = nullptr;
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The smallest free block that fits, if it wastes at most an eighth: an epoch asks for the same
      // sizes in the same order every time, so exact fits are the rule after the first.
      auto it = free_.lower_bound(want);
      if (it != free_.end() && it->first <= want + want / 8) {
        data = it->second;
        size = it->first;
        free_.erase(it);
        cached_ -= size;
        take(data, size);
        hits_++;
      }
    }
    if (data != nullptr) return wrap(data, size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A miss: the memory held (live + cached + this block) stays within a quarter above the largest
      // live set seen, and within max_slack_ bytes above it, so free blocks that no request fits give way
      // before the footprint grows past it. (Within the live set itself, the mix of sizes changes over an
      // epoch and the blocks a later request needs would be evicted; a little above, a training loop's
      // misses stop after its first epochs. The bytes' bound is for graphs whose quarter would be
      // gigabytes: there a miss costs little beside the epoch, and a gigabyte kept is a peak's excess.)
      high_ = std::max(high_, live_ + want);
      while (!free_.empty() && live_ + cached_ + want > high_ + std::min(high_ / 4, max_slack_)) {
        auto largest = std::prev(free_.end());
        cached_ -= largest->first;
        evicted.push_back(largest->second);
        free_.erase(largest);
      }
      misses_++;
    }
    for (void* p : evicted) c10::free_cpu(p);
    data = c10::alloc_cpu(want);  // torch's own: aligned, huge-page advice from 2 MiB (THP_MEM_ALLOC_ENABLE)
    {
      std::lock_guard<std::mutex> lock(mu_);
      take(data, want);
    }
    return wrap(data, want);
  }

  static void release(void* data) { instance->give_back(data); }

  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  void empty() {
    std::multimap<size_t, void*> blocks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks.swap(free_);
      cached_ = 0;
      high_ = live_;
    }
    for (auto& kv : blocks) c10::free_cpu(kv.second);
  }

  void stats(int64_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    out[0] = static_cast<int64_t>(live_);
    out[1] = static_cast<int64_t>(cached_);
    out[2] = static_cast<int64_t>(high_);
    out[3] = hits_;
    out[4] = misses_;
  }

  static BlockCache* instance;

 private:
  static constexpr size_t kPage = 4096;

  c10::DataPtr wrap(void* data, size_t size) {
    report(data, static_cast<int64_t>(size));
    return {data, data, &BlockCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  void take(void* data, size_t size) {  // under mu_
    sizes_[data] = size;
    live_ += size;
  }

  // torch's profiler (profile_memory=True) sees each block as torch's own allocator reports its blocks
  void report(void* data, int64_t delta) {
    if (!c10::memoryProfilingEnabled()) return;
    size_t live, held;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live = live_;
      held = live_ + cached_;
    }
    c10::reportMemoryUsageToProfiler(data, delta, live, held, c10::Device(c10::DeviceType::CPU));
  }

  void give_back(void* data) {
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sizes_.find(data);
      if (it != sizes_.end()) {  // one of ours: kept for the next request it fits
        size = it->second;
        sizes_.erase(it);
        live_ -= size;
        free_.emplace(size, data);
        cached_ += size;
      }
    }
    if (size != 0) {
      report(data, -static_cast<int64_t>(size));
      return;
    }
    // A block torch's allocator made (under 1 MiB): its own deleter frees it
    c10::DeleterFnPtr theirs = base_->raw_deleter();
    if (theirs != nullptr) {
      theirs(data);
    } else {
      c10::free_cpu(data);
    }
  }

  c10::Allocator* base_;
  size_t min_bytes_;
  size_t max_slack_;  // the most bytes kept beyond the largest live set
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> block
  std::unordered_map<void*, size_t> sizes_;  // live block -> its size
  size_t live_ = 0, cached_ = 0, high_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

BlockCache* BlockCache::instance = nullptr;

}  // namespace

// 1: torch's CPU allocations go through the cache now (or already did); 0: torch kept its allocator.
extern "C" int gnnc_block_cache_install(int64_t min_bytes, int64_t max_slack) {
  if (BlockCache::instance == nullptr) {
    BlockCache::instance = new BlockCache(c10::GetCPUAllocator(), static_cast<size_t>(min_bytes),
                                          static_cast<size_t>(max_slack));
    c10::SetCPUAllocator(BlockCache::instance, /*priority=*/1);  // above torch's default (0)
  }
  return c10::GetCPUAllocator() == BlockCache::instance ? 1 : 0;
}

extern "C" void gnnc_block_cache_empty() {
  if (BlockCache::instance != nullptr) BlockCache::instance->empty();
}

// What raw_allocate and raw_deallocate do (torch's and oneDNN's scratch buffers): a block of `nbytes` from
// torch's CPU allocator, written, given back through its raw deleter. 0 when done (for the tests).
extern "C" int gnnc_block_cache_raw_round_trip(int64_t nbytes) {
  c10::Allocator* allocator = c10::GetCPUAllocator();
  void* data = allocator->raw_allocate(static_cast<size_t>(nbytes));
  std::memset(data, 1, static_cast<size_t>(nbytes));
  allocator->raw_deallocate(data);
  return 0;
}

// live bytes, cached bytes, the largest live set, hits, misses
extern "C" void gnnc_block_cache_stats(int64_t* out) {
  if (BlockCache::instance != nullptr) BlockCache::instance->stats(out);
}
