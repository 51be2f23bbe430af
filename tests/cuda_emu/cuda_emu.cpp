// The scheduler of the CUDA emulation: one fiber per CUDA thread, the blocks of a cluster together,
// clusters one after another, checked barriers and warp collectives. See cuda_emu.h.
#include "cuda_emu.h"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <new>
#include <sstream>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define XK_ASAN 1
#else
#define XK_ASAN 0
#endif

// Saves the callee-saved registers and the floating-point control words on the current stack,
// stores the stack pointer in *from_sp and resumes the context saved at to_sp. A context switch
// of glibc's swapcontext costs a system call (the signal mask); the emulation switches at every
// collective of every lane, so it keeps its own (x86-64 System V).
extern "C" void xk_emu_switch(void** from_sp, void* to_sp);
asm(R"(
.text
.globl xk_emu_switch
.type xk_emu_switch,@function
xk_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size xk_emu_switch,.-xk_emu_switch
)");

namespace xk_emu {
namespace {

template <typename T>
struct Aligned256 {
  using value_type = T;
  Aligned256() = default;
  template <typename U>
  Aligned256(const Aligned256<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{256})); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{256}); }
  bool operator==(const Aligned256&) const { return true; }
};

constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kDefaultDynamicSmem = 48 * 1024;

enum class State { kReady, kBarrier, kCluster, kCollective, kDone };

const char* op_name(Op op) {
  switch (op) {
    case Op::kShflIdx: return "__shfl_sync";
    case Op::kShflXor: return "__shfl_xor_sync";
    case Op::kShflDown: return "__shfl_down_sync";
    case Op::kShflUp: return "__shfl_up_sync";
    case Op::kBallot: return "__ballot_sync";
    case Op::kAny: return "__any_sync";
    case Op::kAll: return "__all_sync";
    case Op::kReduceMax: return "__reduce_max_sync";
    case Op::kSyncWarp: return "__syncwarp";
    case Op::kWmma: return "a wmma operation";
  }
  return "?";
}

struct Fiber {
  void* sp = nullptr;  // saved stack pointer while switched out
  std::unique_ptr<char[]> stack;
  Coords coords;
  int linear = 0;  // in its block
  int slot = 0;    // its block's rank in the cluster
  State state = State::kReady;
  Op op = Op::kSyncWarp;
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t in = 0, out = 0;
  void* fake_stack = nullptr;
  // Asynchronous copies (async_copy): the open group, then the committed ones, oldest first; each
  // copy its destination and the source's bytes as read at the copy.
  using Copies = std::vector<std::pair<void*, std::vector<char>>>;
  Copies open_copies;
  std::deque<Copies> copy_groups;
};

struct Emu {
  void* main_sp = nullptr;
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
  void* main_fake_stack = nullptr;
  std::vector<Fiber> fibers;
  Fiber* current = nullptr;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  // Dynamic shared memory of each block of the running cluster, aligned like a kernel's __align__(128) one.
  std::vector<std::vector<char, Aligned256<char>>> smem;
  // Static shared memory of each block of the running cluster, by (block, declaration site).
  std::map<std::pair<int, const void*>, std::vector<char, Aligned256<char>>> statics;
  std::string violation;  // of the running launch
  std::string first_violation;  // since the test last asked
  cudaError_t last_error = cudaSuccess;
  std::map<const void*, int> max_dynamic_smem;
  std::set<const void*> non_portable_cluster;
  std::set<std::string> launched;  // kernel names that have run
  uint64_t row_passes = 0;  // count_row_pass's, since take_row_passes
  uint64_t cluster_launches = 0;  // grids of clusters of 2+ blocks, since take_cluster_launches
  int threads = 0;  // of a block; fibers[blocks * threads..] are spare
  int blocks = 1;   // of the running cluster; the fibers of block `slot` are [slot * threads, (slot + 1) * threads)
  dim3 cluster;
  std::vector<int> done, at_barrier;  // threads of each block of the running cluster
  int cluster_done = 0, at_cluster = 0;  // threads of the running cluster
  Fiber& fiber(int slot, int linear) { return fibers[static_cast<size_t>(slot) * threads + linear]; }
};

Emu& emu() {
  static Emu e;
  return e;
}

std::string where(const Fiber& f) {
  std::ostringstream s;
  s << "thread (" << f.coords.thread_idx.x << "," << f.coords.thread_idx.y << "," << f.coords.thread_idx.z
    << ") of block (" << f.coords.block_idx.x << "," << f.coords.block_idx.y << "," << f.coords.block_idx.z << ")";
  return s.str();
}

std::string hex(unsigned m) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", m);
  return b;
}

void fail(const std::string& what) {
  Emu& e = emu();
  if (e.violation.empty()) e.violation = what;
}

// Fiber -> scheduler.
void yield_to_main(bool finished) {
  Emu& e = emu();
  Fiber* f = e.current;
#if XK_ASAN
  __sanitizer_start_switch_fiber(finished ? nullptr : &f->fake_stack, e.main_stack_bottom, e.main_stack_size);
#endif
  xk_emu_switch(&f->sp, e.main_sp);
#if XK_ASAN
  __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
  (void)finished;
}

void fiber_entry() {
  Emu& e = emu();
#if XK_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &e.main_stack_bottom, &e.main_stack_size);
#endif
  e.body(e.body_arg);
  Fiber* f = e.current;
  f->state = State::kDone;
  ++e.done[f->slot];
  ++e.cluster_done;
  // Lanes waiting for this one at a collective can never complete it.
  const int first = f->linear / 32 * 32, last = std::min(first + 32, e.threads);
  for (int t = first; t < last; ++t) {
    const Fiber& o = e.fiber(f->slot, t);
    if (o.state == State::kCollective && (o.mask >> (f->linear % 32) & 1u))
      fail(where(*f) + " exited while " + where(o) + " waits for it at " + op_name(o.op) + " with mask " +
           hex(o.mask));
  }
  if (e.at_barrier[f->slot]) fail(where(*f) + " exited while other threads wait at __syncthreads");
  if (e.at_cluster) fail(where(*f) + " exited while other threads of its cluster wait at cluster.sync");
  yield_to_main(true);
}

[[noreturn]] void fiber_start() {
  fiber_entry();
  std::abort();  // a finished fiber is never resumed
}

// A fresh stack that xk_emu_switch "returns" into fiber_start from, 16-byte aligned as after a call.
void* initial_stack(char* stack) {
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t{15};
  auto* at = reinterpret_cast<uint64_t*>(top - 16);
  at[0] = reinterpret_cast<uint64_t>(&fiber_start);
  at[1] = 0;
  uint64_t* sp = at - 7;  // control words, r15, r14, r13, r12, rbx, rbp
  for (int i = 0; i < 7; ++i) sp[i] = 0;
  sp[0] = 0x1F80u | (uint64_t{0x037Fu} << 32);  // default MXCSR and x87 control word
  return sp;
}

// Scheduler -> fiber.
void resume(Fiber& f) {
  Emu& e = emu();
  e.current = &f;
#if XK_ASAN
  __sanitizer_start_switch_fiber(&e.main_fake_stack, f.stack.get(), kStackBytes);
#endif
  xk_emu_switch(&e.main_sp, f.sp);
#if XK_ASAN
  __sanitizer_finish_switch_fiber(e.main_fake_stack, nullptr, nullptr);
#endif
  e.current = nullptr;
}

// The lanes of `f`'s warp that exist in the block.
unsigned existing_lanes(const Fiber& f) {
  const int threads = emu().threads;
  const int first = f.linear / 32 * 32;
  const int count = threads - first < 32 ? threads - first : 32;
  return count == 32 ? 0xFFFFFFFFu : (1u << count) - 1u;
}

void complete_collective(std::array<Fiber*, 32>& lanes, Op op) {
  // lanes[l] is the fiber of lane l, or null when l is not in the mask.
  for (int l = 0; l < 32; ++l) {
    Fiber* f = lanes[l];
    if (!f) continue;
    auto read = [&](int src) -> uint64_t {
      if (src < 0 || src >= 32 || !lanes[src]) {
        fail(where(*f) + ": " + op_name(op) + " reads lane " + std::to_string(src) + ", which is not in mask " +
             hex(f->mask));
        return 0;
      }
      return lanes[src]->in;
    };
    const int w = f->width, seg = l / w * w;
    switch (op) {
      case Op::kShflIdx: f->out = read(seg + ((f->arg % w) + w) % w); break;
      case Op::kShflXor: {
        const int src = l ^ f->arg;
        f->out = src >= seg + w ? f->in : read(src);
        break;
      }
      case Op::kShflDown: f->out = l + f->arg >= seg + w ? f->in : read(l + f->arg); break;
      case Op::kShflUp: f->out = l - f->arg < seg ? f->in : read(l - f->arg); break;
      case Op::kBallot:
      case Op::kAny:
      case Op::kAll: {
        unsigned bits = 0, members = 0;
        for (int j = 0; j < 32; ++j)
          if (lanes[j]) members |= 1u << j, bits |= (lanes[j]->in ? 1u : 0u) << j;
        f->out = op == Op::kBallot ? bits : op == Op::kAny ? bits != 0 : bits == members;
        break;
      }
      case Op::kReduceMax: {
        uint64_t top = 0;
        for (int j = 0; j < 32; ++j)
          if (lanes[j]) top = lanes[j]->in > top ? lanes[j]->in : top;
        f->out = top;
        break;
      }
      case Op::kSyncWarp:
      case Op::kWmma: f->out = 0; break;
    }
  }
  for (Fiber* f : lanes)
    if (f) f->state = State::kReady;
}

}  // namespace

const Coords& coords() {
  Emu& e = emu();
  if (!e.current) {
    std::fprintf(stderr, "xk_emu: a CUDA built-in was used outside a kernel\n");
    std::abort();
  }
  return e.current->coords;
}

void report(const std::string& what) { fail(where(*emu().current) + ": " + what); }

void* dynamic_smem_base() {
  Emu& e = emu();
  auto& smem = e.smem[e.current->slot];
  return smem.empty() ? nullptr : smem.data();
}

// Whether [p, p + bytes) lies in the running block's shared memory, dynamic or static.
static bool in_block_shared(const void* p, size_t bytes) {
  Emu& e = emu();
  const int slot = e.current->slot;
  const auto inside = [&](const char* base, size_t size) {
    const auto* c = static_cast<const char*>(p);
    return c >= base && c + bytes <= base + size;
  };
  const auto& dyn = e.smem[slot];
  if (inside(dyn.data(), dyn.size())) return true;
  for (const auto& [key, mem] : e.statics)
    if (key.first == slot && inside(mem.data(), mem.size())) return true;
  return false;
}

void async_copy(void* dst, const void* src, size_t bytes, size_t zfill) {
  coords();  // only inside a kernel
  if (zfill) return report("__pipeline_memcpy_async with zfill (not emulated)");
  if (bytes != 4 && bytes != 8 && bytes != 16)
    return report("__pipeline_memcpy_async of " + std::to_string(bytes) + " bytes (4, 8 or 16)");
  if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes)
    return report("__pipeline_memcpy_async with a source or destination not aligned to its " +
                  std::to_string(bytes) + " bytes");
  if (!in_block_shared(dst, bytes)) return report("__pipeline_memcpy_async to outside the block's shared memory");
  const auto* from = static_cast<const char*>(src);
  emu().current->open_copies.emplace_back(dst, std::vector<char>(from, from + bytes));
}

void async_commit() {
  coords();
  Fiber& f = *emu().current;
  f.copy_groups.push_back(std::move(f.open_copies));
  f.open_copies.clear();
}

void async_wait_prior(size_t prior) {
  coords();
  Fiber& f = *emu().current;
  for (; f.copy_groups.size() > prior; f.copy_groups.pop_front())
    for (const auto& [dst, bytes] : f.copy_groups.front()) std::memcpy(dst, bytes.data(), bytes.size());
}

void* block_shared_bytes(const void* site, size_t bytes) {
  Emu& e = emu();
  auto [it, fresh] = e.statics.try_emplace({e.current->slot, site});
  if (fresh) it->second.assign(bytes, static_cast<char>(0xA5));  // shared memory starts as garbage
  return it->second.data();
}

uint64_t warp_collective(Op op, unsigned mask, uint64_t value, int arg, int width) {
  Emu& e = emu();
  Fiber* f = e.current;
  const int lane = f->linear % 32;
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) fail(where(*f) + ": width must be a power of 2 <= 32");
  if (!(mask >> lane & 1u))
    fail(where(*f) + ": " + op_name(op) + " with mask " + hex(mask) + ", which leaves out the calling lane " +
         std::to_string(lane));
  if (mask & ~existing_lanes(*f))
    fail(where(*f) + ": " + op_name(op) + " mask " + hex(mask) + " names lanes the block does not have");
  f->state = State::kCollective;
  f->op = op, f->mask = mask, f->in = value, f->arg = arg, f->width = width;

  std::array<Fiber*, 32> lanes{};
  bool all_here = e.violation.empty();
  const int first = f->linear / 32 * 32;
  for (int l = 0; l < 32 && e.violation.empty(); ++l) {
    if (!(mask >> l & 1u)) continue;
    Fiber& o = e.fiber(f->slot, first + l);
    lanes[l] = &o;
    if (o.state == State::kDone) {
      fail(where(*f) + ": " + op_name(op) + " with mask " + hex(mask) + " names lane " + std::to_string(l) +
           ", which has exited");
    } else if (o.state == State::kBarrier || o.state == State::kCluster) {
      fail(where(*f) + ": " + op_name(op) + " waits for lane " + std::to_string(l) + ", which sits at " +
           (o.state == State::kBarrier ? "__syncthreads" : "cluster.sync"));
    } else if (o.state == State::kCollective) {
      if (o.op != op || o.mask != mask || o.width != width)
        fail(where(*f) + ": " + op_name(op) + " with mask " + hex(mask) + " meets " + where(o) + " at " +
             op_name(o.op) + " with mask " + hex(o.mask));
    } else {
      all_here = false;
    }
  }
  if (all_here && e.violation.empty()) complete_collective(lanes, op);
  yield_to_main(false);
  return f->out;
}

namespace {

// A thread arriving at a barrier (`what`) that lanes of its warp wait for at a collective, or that
// threads of its block wait for at the other kind of barrier, can never complete either.
void check_barrier_arrival(const Fiber& f, const char* what, State other, const char* other_what) {
  Emu& e = emu();
  const int first = f.linear / 32 * 32, last = std::min(first + 32, e.threads);
  for (int t = first; t < last; ++t) {
    const Fiber& o = e.fiber(f.slot, t);
    if (o.state == State::kCollective && (o.mask >> (f.linear % 32) & 1u))
      fail(where(f) + " reached " + what + " while " + where(o) + " waits for it at " + op_name(o.op));
  }
  for (int t = 0; t < e.threads && e.violation.empty(); ++t) {
    const Fiber& o = e.fiber(f.slot, t);
    if (o.state == other) fail(where(f) + " reached " + what + " while " + where(o) + " waits at " + other_what);
  }
}

}  // namespace

void block_barrier() {
  Emu& e = emu();
  Fiber* f = e.current;
  f->state = State::kBarrier;
  if (e.done[f->slot]) fail(where(*f) + " reached __syncthreads after a thread of its block exited");
  check_barrier_arrival(*f, "__syncthreads", State::kCluster, "cluster.sync");
  if (++e.at_barrier[f->slot] == e.threads && e.violation.empty()) {
    for (int t = 0; t < e.threads; ++t) e.fiber(f->slot, t).state = State::kReady;
    e.at_barrier[f->slot] = 0;
  }
  yield_to_main(false);
}

void cluster_barrier() {
  Emu& e = emu();
  Fiber* f = e.current;
  f->state = State::kCluster;
  if (e.cluster_done) fail(where(*f) + " reached cluster.sync after a thread of its cluster exited");
  check_barrier_arrival(*f, "cluster.sync", State::kBarrier, "__syncthreads");
  if (++e.at_cluster == e.threads * e.blocks && e.violation.empty()) {
    for (int t = 0; t < e.threads * e.blocks; ++t) e.fibers[t].state = State::kReady;
    e.at_cluster = 0;
  }
  yield_to_main(false);
}

unsigned cluster_block_rank() {
  coords();  // only inside a kernel
  return static_cast<unsigned>(emu().current->slot);
}

dim3 cluster_dims() {
  coords();
  return emu().cluster;
}

cudaError_t launch_check(const void* kernel, dim3 grid, dim3 block, size_t smem, dim3 cluster) {
  Emu& e = emu();
  std::string bad;
  const uint64_t threads = static_cast<uint64_t>(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) bad = "empty grid";
  else if (grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) bad = "grid too large";
  else if (threads == 0 || threads > 1024 || block.z > 64) bad = "block of " + std::to_string(threads) + " threads";
  size_t smem_limit = kDefaultDynamicSmem;
  if (auto it = e.max_dynamic_smem.find(kernel); it != e.max_dynamic_smem.end())
    smem_limit = static_cast<size_t>(it->second);
  if (bad.empty() && smem > smem_limit)
    bad = std::to_string(smem) + " bytes of dynamic shared memory without the opt-in (limit " +
          std::to_string(smem_limit) + ")";
  cudaError_t err = bad.find("shared memory") != std::string::npos ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration;
  const uint64_t cluster_blocks = static_cast<uint64_t>(cluster.x) * cluster.y * cluster.z;
  const std::string shape = "(" + std::to_string(cluster.x) + "," + std::to_string(cluster.y) + "," +
                            std::to_string(cluster.z) + ")";
  std::string bad_cluster;
  if (cluster_blocks == 0) bad_cluster = "empty cluster " + shape;
  else if (grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z)
    bad_cluster = "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) +
                  ") not a multiple of the cluster " + shape;
  else if (cluster_blocks > 16) bad_cluster = "cluster " + shape + " of more than 16 blocks";
  else if (cluster_blocks > 8 && !e.non_portable_cluster.count(kernel))
    bad_cluster = "cluster " + shape + " of more than 8 blocks without the non-portable opt-in";
  if (bad.empty() && !bad_cluster.empty()) bad = bad_cluster, err = cudaErrorInvalidClusterSize;
  if (bad.empty()) return cudaSuccess;
  if (e.first_violation.empty()) e.first_violation = "launch refused: " + bad;
  e.last_error = err;
  return e.last_error;
}

void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, void (*body)(void*), void* arg, dim3 cluster) {
  Emu& e = emu();
  if (!e.violation.empty() || e.last_error != cudaSuccess) return;  // a failed stream runs nothing more
  e.launched.insert(name);
  const int threads = static_cast<int>(block.x * block.y * block.z);
  const int blocks = static_cast<int>(cluster.x * cluster.y * cluster.z);
  if (blocks > 1) ++e.cluster_launches;
  const size_t fibers = static_cast<size_t>(threads) * blocks;
  if (e.fibers.size() < fibers) e.fibers.resize(fibers);
  for (Fiber& f : e.fibers)  // stacks are kept from launch to launch
    if (!f.stack) f.stack.reset(new char[kStackBytes]);
  e.threads = threads, e.blocks = blocks, e.cluster = cluster;
  e.body = body, e.body_arg = arg;
  e.smem.resize(static_cast<size_t>(blocks));
  e.done.assign(static_cast<size_t>(blocks), 0);
  e.at_barrier.assign(static_cast<size_t>(blocks), 0);
  const auto clean = [&] {
    for (auto& m : e.smem) m.clear();
    e.statics.clear();
  };
  for (unsigned cz = 0; cz < grid.z; cz += cluster.z)
    for (unsigned cy = 0; cy < grid.y; cy += cluster.y)
      for (unsigned cx = 0; cx < grid.x; cx += cluster.x) {
        clean();
        for (auto& m : e.smem) m.assign(smem, static_cast<char>(0xA5));  // exactly the bytes asked for, not zeroed
        std::fill(e.done.begin(), e.done.end(), 0);
        std::fill(e.at_barrier.begin(), e.at_barrier.end(), 0);
        e.cluster_done = e.at_cluster = 0;
        for (int slot = 0; slot < blocks; ++slot) {
          // A block's rank in its cluster runs x fastest, as cluster.block_rank() does.
          const dim3 bidx(cx + slot % cluster.x, cy + slot / cluster.x % cluster.y, cz + slot / (cluster.x * cluster.y));
          for (int t = 0; t < threads; ++t) {
            Fiber& f = e.fiber(slot, t);
            f.linear = t, f.slot = slot;
            f.state = State::kReady;
            f.open_copies.clear(), f.copy_groups.clear();  // a kernel's copies not waited for are dropped
            f.coords = Coords{dim3(t % block.x, t / block.x % block.y, t / (block.x * block.y)), bidx, block, grid};
            f.sp = initial_stack(f.stack.get());
          }
        }
        for (;;) {
          bool ran = false;
          for (size_t t = 0; t < fibers; ++t) {
            Fiber& f = e.fibers[t];
            if (f.state == State::kReady) {
              resume(f);
              ran = true;
              if (!e.violation.empty()) break;
            }
          }
          if (!e.violation.empty()) break;
          if (e.cluster_done == threads * blocks) break;
          if (!ran) {
            fail("deadlock: no thread of the cluster of block (" + std::to_string(cx) + "," + std::to_string(cy) + "," +
                 std::to_string(cz) + ") can run (threads wait at barriers or collectives whose threads never arrive)");
            break;
          }
        }
        if (!e.violation.empty()) {
          // The fibers that were stopped mid-kernel are dropped (kernels keep no resources on their
          // stacks); their frames' redzones are cleared so the stacks can be used again.
#if XK_ASAN
          for (Fiber& f : e.fibers) __asan_unpoison_memory_region(f.stack.get(), kStackBytes);
#endif
          if (e.first_violation.empty()) e.first_violation = e.violation;
          e.violation.clear();
          e.last_error = cudaErrorLaunchFailure;
          clean();
          return;
        }
      }
  clean();
}

cudaError_t take_last_error(bool clear) {
  Emu& e = emu();
  const cudaError_t err = e.last_error;
  if (clear) e.last_error = cudaSuccess;
  return err;
}

void set_max_dynamic_smem(const void* kernel, int bytes) { emu().max_dynamic_smem[kernel] = bytes; }

void set_non_portable_cluster_size(const void* kernel, bool allowed) {
  if (allowed)
    emu().non_portable_cluster.insert(kernel);
  else
    emu().non_portable_cluster.erase(kernel);
}

std::string launched_kernels() {
  std::string out;
  for (const std::string& name : emu().launched) out += (out.empty() ? "" : ",") + name;
  return out;
}

std::string take_violation() {
  std::string v;
  v.swap(emu().first_violation);
  return v;
}

void count_row_pass() {
  const Coords& c = coords();
  if (c.thread_idx.x == 0 && c.thread_idx.y == 0 && c.thread_idx.z == 0) ++emu().row_passes;
}

uint64_t take_row_passes() {
  const uint64_t n = emu().row_passes;
  emu().row_passes = 0;
  return n;
}

uint64_t take_cluster_launches() {
  const uint64_t n = emu().cluster_launches;
  emu().cluster_launches = 0;
  return n;
}

}  // namespace xk_emu
