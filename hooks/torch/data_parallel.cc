// Data parallel training over torch's c10d process groups: gradients reduced
// to their owners, parameters gathered from them.
//
// Note [Data parallel over chunk groups]
// Each rank trains the same models on its own micro-batch. Ownership follows
// the chunks (Note [Chunk groups across ranks] in rank_layout.cc): rank r
// owns chunk r of each group of N parameter chunks.
//  - A reduction (during backward, each group as its gradients complete:
//    Note [Reducing while backward runs] in backward_reduction.cc; or
//    reduce_gradients(), for what a backward left): for each group, one
//    all-to-all sends every rank's gradients of member j to rank j (in
//    their own dtype: Note [Gradients travel in their own dtype]); the
//    owner sums them in fp32 in rank order and divides by N, which is deterministic and is what the
//    in-process oracle computes (where the collectives run on a GPU, one
//    reduce-scatter instead: Note [Reduce-scatter where the collectives run
//    on a GPU]). The owner's gradient is that mean; on other
//    ranks the gradient is set to none and its grad chunk discarded. Any
//    optimizer then steps the owned parameters only, since torch's
//    optimizers, and spillway's, skip a parameter without a gradient: the
//    optimizer state exists on the owner alone. A parameter no rank reached
//    this step stays without a gradient everywhere, as in torch; each
//    parameter's flag travels beside its values.
//  - step() (gather_owned_parameters): for each group, one all-gather of the
//    owners' parameter bytes, padded to the group's largest member; every
//    rank copies in what it does not own. Bytes, not values: nothing is
//    rounded. Buffers and frozen parameters, which no optimizer steps, come
//    from rank 0 instead (Note [What no optimizer steps comes from rank 0]).
//  - manage() and set_process_group() are collectives: they compare the
//    layouts across ranks and give every rank the owners' values, as DDP's
//    constructor broadcasts rank 0's.
// Every collective is issued in the same order on every rank (clients in the
// order they were added, groups in chunk order), from the layout all ranks
// agreed on; never from local memory pressure or timing. Bytes move through
// ordinary tensors with torch ops, so the op hooks fetch every chunk they
// read or write, under strict residency too.
//
// Note [A reduction reduces what backward wrote since the last]
// Several callers may reduce the same gradients in one step: a clipping of
// the mean gradient, a loss scaler's overflow check, then the optimizer's
// pre-hook. A second reduction would divide the mean by N again, so
// reducing must be idempotent. Each parameter's gradient_unreduced flag is
// set by its gradient accumulator's post hook (every backward that reaches
// it) and at manage(), and cleared when its group's gradients are packed
// for a reduction (Note [A reduction sends what backward wrote since the
// last]). Whether a model is reduced is decided by all ranks together: one
// all-reduce (max) of each model's "some flag set" before the all-to-alls,
// so a rank whose backward reached none of a model's parameters still joins
// its reduction, and a reduction with nothing written since the last is
// skipped by all.
//
// Note [A backward onto a reduced gradient]
// After a reduction the owner's gradient is the mean over the ranks. A
// backward before the gradients are zeroed (a micro-batch after the
// reduction, or a step without zero_grad) would add this rank's new
// gradient to that mean, and the next reduction would divide the mean by N
// again: wrong values, silently. So each reduction remembers the owner's
// gradient tensor (weakly) and its version counter, and the post hook of
// every accumulation checks: if the gradient is still that tensor and its
// version moved by exactly one, the accumulation was the first write since
// the reduction, and the backward fails, naming the parameter. A zero_grad
// in between sets the gradient to none (another tensor) or zeroes it in
// place (one more version), so a correct loop never trips it; a GradScaler's
// unscale_ or a clipping after the reduction also moves the version, so
// their loops are not checked that far.
//
// Note [Per-parameter figures summed over owners]
// After a reduction each gradient lives on its owner alone. A figure of it
// (its norm, its sum of squares) is then known on one rank, and every rank
// needs all of them, in parameter order, to compute the global norm exactly
// as one process would. One all-reduce (sum) of the figures, with zeros
// where a rank has none, plus a 1 per figure present, gives every rank the
// list: x + 0 is exact, so the figures arrive unchanged, and the sums of the
// ones show a figure present on two ranks (a parameter never reduced),
// which is refused rather than counted twice.
#include "hooks/torch/data_parallel.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "hooks/torch/client_names.h"
#include "hooks/torch/collective_wait.h"
#include "hooks/torch/rank_layout.h"
#include "hooks/torch/sharded_params.h"
#include "hooks/torch/spillway_torch.h"

namespace spillway {

namespace torch_bridge {

namespace {

struct DataParallelState {
  std::mutex mutex;  // serialises the collectives: one sequence per process
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  // Whether `group` is set, read without the lock: every gradient
  // accumulation asks (reduce_as_backward_completes), with or without one.
  std::atomic<bool> has_group{false};
  std::uint64_t operations = 0;  // Note [A failed collective names the missing ranks]
  GradientReduction reduction = GradientReduction::by_device;
};

DataParallelState& data_parallel() {
  static DataParallelState* const state = new DataParallelState();  // never destroyed
  return *state;
}

// A parameter's element count, and its bytes in logical order.
std::int64_t elements(const ManagedParam& managed) { return managed.param.numel(); }
std::int64_t bytes(const ManagedParam& managed) {
  return managed.param.numel() * static_cast<std::int64_t>(managed.param.element_size());
}

// The parameter's values as bytes, in logical order (a copy when its
// strides are not contiguous), and the reverse: `values` written into it.
// Bytes, so nothing is rounded; a clone first, so the dtype view is aligned.
at::Tensor bytes_of(const ManagedParam& managed) {
  return managed.param.detach().contiguous().view({-1}).view(at::kByte);
}
void write_bytes(const ManagedParam& managed, const at::Tensor& values) {
  managed.param.detach().copy_(
      values.clone().view(managed.param.scalar_type()).view(managed.param.sizes()));
}

// Calls `use` with a tensor of its own over the parameter's bytes in its
// chunk, acquired in `mode`: no op on the parameter, so neither its hooks
// nor its version counter see it. `doing` says what fails in an error.
template <typename Use>
void in_chunk(ChunkManager& chunks, const ManagedParam& managed, AccessMode mode,
              std::string_view doing, Use use) {
  const at::Tensor& param = managed.param;
  const OpStream on = op_stream(param.device());
  void* address = nullptr;
  if (chunks.acquire(managed.param_id, on.stream, &address, mode, on.wait, OverBudget::overrun) !=
      Status::ok)
    throw std::runtime_error(fmt::format("spillway data parallel: {} '{}' of model '{}' failed: {}",
                                         doing, tensor_name(chunks, managed.param_id),
                                         client_name(managed.client), ChunkManager::last_error()));
  try {
    use(at::from_blob(address, param.sizes(), param.strides(),
                      at::TensorOptions(param.scalar_type()).device(param.device())));
  } catch (...) {
    chunks.release(managed.param_id, on.stream);
    throw;
  }
  chunks.release(managed.param_id, on.stream);
}

// Writes `values` (bytes in logical order) into the parameter's chunk
// without an op on the parameter. An op would bump its version counter,
// and autograd refuses a backward through a tensor written since forward
// saved it: a group gathered again during backward (Note [Parameters
// gathered for their use], sharded_params.cc) or a step's gathering
// between a forward and its backward.
void write_gathered(ChunkManager& chunks, const ManagedParam& managed, const at::Tensor& values) {
  in_chunk(chunks, managed, AccessMode::read_write, "writing the gathered values of",
           [&](const at::Tensor& in) {
             in.copy_(values.clone().view(managed.param.scalar_type()).view(managed.param.sizes()));
           });
}

// Copies the parameter's bytes, in logical order, from its chunk into
// `destination` without an op on it: a gather issued ahead of its use reads
// the owner's bytes while the group still reads as dropped, where an op
// would gather it.
void copy_from_chunk(ChunkManager& chunks, const ManagedParam& managed,
                     const at::Tensor& destination) {
  in_chunk(
      chunks, managed, AccessMode::read, "reading the values to send of",
      [&](const at::Tensor& in) { destination.copy_(in.contiguous().view({-1}).view(at::kByte)); });
}

// The member's parameters that `moved` selects, in layout order: what the
// reductions (those their owner steps: stepped_by_owner) and the gatherings
// move.
std::vector<ManagedParam*> selected(const std::vector<std::shared_ptr<ManagedParam>>& member,
                                    bool (*moved)(const ManagedParam&)) {
  std::vector<ManagedParam*> params;
  for (const auto& managed : member)
    if (moved(*managed)) params.push_back(managed.get());
  return params;
}

}  // namespace

GroupGather::GroupGather(PendingCollective collective, at::Tensor all, std::int64_t widest,
                         std::vector<std::vector<ManagedParam*>> members)
    : collective_(std::move(collective)),
      all_(std::move(all)),
      widest_(widest),
      members_(std::move(members)) {}

void GroupGather::finish(int rank) {
  if (!collective_.has_value()) return;
  collective_->wait();
  collective_.reset();
  ChunkManager& chunks = active_chunk_manager();
  for (std::size_t owner = 0; owner < members_.size(); ++owner) {
    if (static_cast<int>(owner) == rank) continue;
    std::int64_t offset = widest_ * static_cast<std::int64_t>(owner);
    for (const ManagedParam* managed : members_[owner]) {
      write_gathered(chunks, *managed, all_.narrow(0, offset, bytes(*managed)));
      offset += bytes(*managed);
    }
  }
}

void GroupGather::abandon() {
  if (!collective_.has_value()) return;
  collective_->wait();
  collective_.reset();
}

GroupGather start_group_gather(c10d::ProcessGroup& group, const ChunkGroup& chunk_group,
                               bool (*moved)(const ManagedParam&)) {
  const int world = group.getSize();
  const int rank = group.getRank();
  std::vector<std::vector<ManagedParam*>> members;
  for (const auto& member : chunk_group.members) members.push_back(selected(member, moved));
  std::int64_t widest = 0;
  for (const auto& member : members) {
    std::int64_t member_bytes = 0;
    for (const ManagedParam* managed : member) member_bytes += bytes(*managed);
    widest = std::max(widest, member_bytes);
  }
  if (widest == 0) return {};
  at::NoGradGuard no_grad;
  // Note [The device collectives take]
  const at::TensorOptions staging = at::TensorOptions(at::kByte).device(collective_device(group));
  at::Tensor mine = at::zeros({widest}, staging);
  ChunkManager& chunks = active_chunk_manager();
  std::int64_t offset = 0;
  for (const ManagedParam* managed : members[static_cast<std::size_t>(rank)]) {
    copy_from_chunk(chunks, *managed, mine.narrow(0, offset, bytes(*managed)));
    offset += bytes(*managed);
  }
  at::Tensor all = at::empty({widest * world}, staging);
  PendingCollective collective =
      start_collective(group, "gathering parameters", all_gather_payload(widest, world),
                       [&] { return group._allgather_base(all, mine); });
  return {std::move(collective), std::move(all), widest, std::move(members)};
}

void gather_chunk_group(c10d::ProcessGroup& group, const ChunkGroup& chunk_group,
                        bool (*moved)(const ManagedParam&)) {
  start_group_gather(group, chunk_group, moved).finish(group.getRank());
}

// Note [What no optimizer steps comes from rank 0]
// Buffers (batch norm's running statistics) change in every rank's forward,
// each by its own micro-batch, and no optimizer steps them; DDP broadcasts
// rank 0's. So do we, at every gathering, for everything that is not
// stepped_by_owner (frozen parameters too, which agree anyway unless a rank
// changed them): one broadcast per model of all such tensors' bytes.
void broadcast_from_rank_zero(c10d::ProcessGroup& group, const RankLayout& layout) {
  std::vector<ManagedParam*> unstepped;
  std::int64_t total = 0;
  for (const ChunkGroup& chunk_group : layout.groups)
    for (const auto& member : chunk_group.members)
      for (const auto& managed : member)
        if (!stepped_by_owner(*managed)) {
          unstepped.push_back(managed.get());
          total += bytes(*managed);
        }
  if (total == 0) return;
  at::NoGradGuard no_grad;
  const bool root = group.getRank() == 0;
  at::Tensor all =
      at::empty({total}, at::TensorOptions(at::kByte).device(collective_device(group)));
  std::int64_t offset = 0;
  if (root)
    for (const ManagedParam* managed : unstepped) {
      all.narrow(0, offset, bytes(*managed)).copy_(bytes_of(*managed));
      offset += bytes(*managed);
    }
  std::vector<at::Tensor> tensors{all};
  run_collective(group, "broadcasting buffers from rank 0",
                 broadcast_payload(total, group.getSize(), root),
                 [&] { return group.broadcast(tensors, c10d::BroadcastOptions{0}); });
  if (root) return;
  offset = 0;
  for (const ManagedParam* managed : unstepped) {
    write_bytes(*managed, all.narrow(0, offset, bytes(*managed)));
    offset += bytes(*managed);
  }
}

namespace {

// Note [Gradients travel in their own dtype]
// A member's segment in the all-to-all holds its gradients in their own
// dtype, not widened: bf16 and fp16 gradients cross as 2 bytes each. The
// owner widens each rank's values to the sum's dtype (fp32 for 16-bit
// gradients, the gradient's own for fp32 and fp64), which is exact, then
// sums in rank order and divides by N: the same arithmetic as sending fp32
// copies, for half the bytes. Consecutive parameters of one dtype form a
// run, summed by one op per rank; each run starts 16-byte aligned so that
// it is viewed in place. One flag byte per parameter follows the runs.
struct GradientRun {
  at::ScalarType dtype;
  std::int64_t offset = 0;    // in bytes, from the segment's start
  std::int64_t elements = 0;  // of all its parameters together
  std::vector<ManagedParam*> params;
};

struct SegmentLayout {
  std::vector<GradientRun> runs;
  std::int64_t flags_offset = 0;  // one byte per parameter, in member order
  std::int64_t bytes = 0;         // a multiple of 16, so the next segment is aligned
};

std::int64_t align16(std::int64_t bytes) { return (bytes + 15) / 16 * 16; }

SegmentLayout segment_layout(const std::vector<ManagedParam*>& member) {
  SegmentLayout layout;
  std::int64_t end = 0;
  for (ManagedParam* managed : member) {
    const at::ScalarType dtype = managed->param.scalar_type();
    if (layout.runs.empty() || layout.runs.back().dtype != dtype)
      layout.runs.push_back({dtype, align16(end), 0, {}});
    GradientRun& run = layout.runs.back();
    run.elements += elements(*managed);
    run.params.push_back(managed);
    end = run.offset + run.elements * static_cast<std::int64_t>(c10::elementSize(dtype));
  }
  layout.flags_offset = end;
  layout.bytes = member.empty() ? 0 : align16(end + static_cast<std::int64_t>(member.size()));
  return layout;
}

// `bytes` (a byte tensor) from `offset` viewed as `count` values of `dtype`.
at::Tensor values_at(const at::Tensor& bytes, std::int64_t offset, std::int64_t count,
                     at::ScalarType dtype) {
  const auto size = static_cast<std::int64_t>(c10::elementSize(dtype));
  return bytes.narrow(0, offset, count * size).view(dtype);
}

// Note [A reduction sends what backward wrote since the last]
// A parameter's gradient takes part in a reduction only when a backward
// wrote it since the group was last reduced (its gradient_unreduced flag);
// where no rank did, the owner's gradient stays as it is. So reducing a
// group again within one backward is harmless: what an earlier reduction
// left (the owner's mean) is neither sent again nor overwritten. Reentrant
// activation checkpointing needs that: each checkpointed segment's
// recomputation is a backward of its own, nested in the outer one (Note
// [Reducing while backward runs]), and a chunk group whose parameters span
// segments is reduced once per backward that writes some of them. The flags
// are cleared when a group's gradients are packed, not when its collective
// ends, so a write after the packing is reduced next time; on the owner,
// such a write would be overwritten by the mean, so it is refused (Note
// [No write to a gradient in flight]).
bool contributes(const ManagedParam& managed) {
  return managed.param.grad().defined() &&
         managed.gradient_unreduced.load(std::memory_order_acquire);
}

// Copies `managed`'s gradient, flat, into `slot` (converting its dtype)
// where it contributes to this reduction, else zeros; whether it does.
bool copy_gradient(const ManagedParam& managed, at::Tensor slot) {
  if (!contributes(managed)) {
    slot.zero_();
    return false;
  }
  slot.copy_(managed.param.grad().reshape({-1}));
  return true;
}

// Note [No write to a gradient in flight]
// The owner's gradients as they were packed. A backward that writes one of
// them before the collective ends (a parameter used both inside and
// outside a reentrant checkpoint, say) would be overwritten by the mean
// and lost, where some rank sent a gradient for it; finishing the
// reduction refuses that instead, naming the parameter. Where no rank sent
// one, the owner's gradient is left as it is, and the write with it.
struct PackedGradient {
  ManagedParam* managed = nullptr;
  at::Tensor grad;  // undefined when it had none
  std::uint32_t version = 0;
};

std::vector<PackedGradient> packed_gradients(const std::vector<ManagedParam*>& own) {
  std::vector<PackedGradient> packed;
  for (ManagedParam* managed : own) {
    at::Tensor grad = managed->param.grad();
    const std::uint32_t version = grad.defined() ? grad._version() : 0;
    packed.push_back({managed, std::move(grad), version});
  }
  return packed;
}

void check_unwritten_since_packed(const PackedGradient& before) {
  const at::Tensor now = before.managed->param.grad();
  if (now.unsafeGetTensorImpl() == before.grad.unsafeGetTensorImpl() &&
      (!now.defined() || now._version() == before.version))
    return;
  throw std::runtime_error(fmt::format(
      "spillway data parallel: a backward wrote the gradient of '{}' of model '{}' while its "
      "chunk group's reduction across ranks was in flight, and the mean would overwrite what "
      "it wrote. This happens when one backward writes a gradient twice, as a parameter used "
      "both inside and outside a reentrant activation checkpoint does: checkpoint with "
      "use_reentrant=False, or keep the parameter on one side",
      tensor_name(active_chunk_manager(), before.managed->param_id),
      client_name(before.managed->client)));
}

// Fills `segment` (a byte tensor) with this rank's gradients of `layout`'s
// parameters and their flags.
void pack_gradients(const SegmentLayout& layout, at::Tensor segment) {
  std::vector<std::uint8_t> flags;
  for (const GradientRun& run : layout.runs) {
    std::int64_t offset = 0;
    const at::Tensor values = values_at(segment, run.offset, run.elements, run.dtype);
    for (const ManagedParam* managed : run.params) {
      flags.push_back(copy_gradient(*managed, values.narrow(0, offset, elements(*managed))) ? 1
                                                                                            : 0);
      offset += elements(*managed);
    }
  }
  const auto count = static_cast<std::int64_t>(flags.size());
  segment.narrow(0, layout.flags_offset, count).copy_(at::tensor(flags, at::kByte));
  segment.narrow(0, layout.flags_offset + count, layout.bytes - layout.flags_offset - count)
      .zero_();
}

// The owner's gradient after a reduction: `mean` (its values, flat, in any
// floating dtype) where some rank wrote the parameter's gradient since the
// last reduction, else unchanged.
void set_reduced_gradient(const PackedGradient& packed, bool reached, const at::Tensor& mean) {
  // Note [A reduction sends what backward wrote since the last]
  if (!reached) return;
  check_unwritten_since_packed(packed);  // Note [No write to a gradient in flight]
  ManagedParam& managed = *packed.managed;
  std::lock_guard lock(managed.grad_mutex);
  // Into the chunk, unless a bound gradient that p.grad no longer is is held
  // elsewhere (Note [A replaced gradient someone holds keeps its values]).
  const bool into_chunk =
      managed.bound_grad.defined() && (managed.param.grad().is_same(managed.bound_grad) ||
                                       only_the_bridge_holds_bound_grad(managed));
  at::Tensor target = into_chunk ? managed.bound_grad : managed.param.grad();
  if (!target.defined()) target = at::empty_like(managed.param);
  target.copy_(mean.view(managed.param.sizes()));
  managed.param.mutable_grad() = target;
  // Note [A backward onto a reduced gradient]
  managed.reduced_grad = c10::weak_intrusive_ptr<c10::TensorImpl>(target.getIntrusivePtr());
  managed.reduced_grad_version = target._version();
}

// Gives the owner, for every parameter of `layout` (`packed`, in the same
// order), the mean over the ranks of the segments in `received` (one per
// rank, in rank order), where some rank sent a gradient.
void write_means(const SegmentLayout& layout, const std::vector<PackedGradient>& packed,
                 const at::Tensor& received, int world) {
  std::int64_t flag_count = 0;
  for (const GradientRun& run : layout.runs)
    flag_count += static_cast<std::int64_t>(run.params.size());
  at::Tensor reached = at::zeros({flag_count}, received.options().dtype(at::kInt));
  for (int from = 0; from < world; ++from)
    reached.add_(received.narrow(0, layout.bytes * from + layout.flags_offset, flag_count));
  const at::Tensor any = reached.gt(0).cpu();
  const auto reached_by = any.accessor<bool, 1>();
  std::int64_t index = 0;
  for (const GradientRun& run : layout.runs) {
    const at::ScalarType sum_dtype = at::promote_types(run.dtype, at::kFloat);
    // Sum in rank order, then divide: the oracle's arithmetic.
    at::Tensor mean = values_at(received, run.offset, run.elements, run.dtype).to(sum_dtype);
    for (int from = 1; from < world; ++from)
      mean.add_(values_at(received, layout.bytes * from + run.offset, run.elements, run.dtype));
    mean.div_(static_cast<double>(world));
    std::int64_t offset = 0;
    for (ManagedParam* param : run.params) {
      const auto i = static_cast<std::size_t>(index);
      set_reduced_gradient(packed[i], reached_by[index++],
                           mean.narrow(0, offset, elements(*param)));
      offset += elements(*param);
    }
  }
}

// After a reduction: the gradients of what other ranks own are set to none
// and their grad chunks discarded.
void drop_gradients_owned_elsewhere(ChunkManager& chunks,
                                    const std::vector<std::vector<ManagedParam*>>& members,
                                    int rank) {
  for (std::size_t j = 0; j < members.size(); ++j) {
    if (static_cast<int>(j) == rank) continue;
    for (ManagedParam* managed : members[j]) {
      std::lock_guard lock(managed->grad_mutex);
      managed->param.mutable_grad().reset();
      if (managed->bound_grad.defined() && chunks.discard(managed->grad_id) != Status::ok)
        throw std::runtime_error(fmt::format(
            "spillway data parallel: could not discard the gradient of a parameter rank {} "
            "owns: {}",
            j, ChunkManager::last_error()));
    }
  }
}

// Note [Reduce-scatter where the collectives run on a GPU]
// NCCL sums on the wire: a reduce-scatter moves (N-1)/N of the group each
// way and needs no staging of N received copies, where an all-to-all would
// make the owner sum N segments itself. It takes one dtype and equal
// segments, so every member's gradients are widened to the sum's dtype
// (fp32; fp64 where the group holds an fp64 parameter) and padded to the
// largest member; each parameter's flag is a 1 or 0 of that dtype after the
// member's values, summed with them. The owner divides by N, as the
// all-to-all path does. The order of the sum is the backend's, so the
// result is bit for bit the oracle's at N = 2 (a + b = b + a) and within
// rounding beyond; Gloo keeps the all-to-all, which sums in rank order.
at::ScalarType reduce_scatter_dtype(const std::vector<std::vector<ManagedParam*>>& members) {
  for (const auto& member : members)
    for (const ManagedParam* managed : member)
      if (managed->param.scalar_type() == at::kDouble) return at::kDouble;
  return at::kFloat;
}

std::int64_t widened_segment_elements(const std::vector<ManagedParam*>& member) {
  std::int64_t total = static_cast<std::int64_t>(member.size());  // the flags
  for (const ManagedParam* managed : member) total += elements(*managed);
  return total;
}

// Fills `segment` with this rank's gradients of `member`, widened, then
// their flags, then zeros.
void pack_widened_gradients(const std::vector<ManagedParam*>& member, at::Tensor segment) {
  std::int64_t offset = 0;
  std::vector<double> flags;
  for (const ManagedParam* managed : member) {
    flags.push_back(copy_gradient(*managed, segment.narrow(0, offset, elements(*managed))) ? 1.0
                                                                                           : 0.0);
    offset += elements(*managed);
  }
  const auto count = static_cast<std::int64_t>(flags.size());
  segment.narrow(0, offset, count).copy_(at::tensor(flags, at::kDouble));
  segment.narrow(0, offset + count, segment.numel() - offset - count).zero_();
}

GroupReduction start_reduce_scatter(ChunkManager& chunks, c10d::ProcessGroup& group,
                                    const ChunkGroup& chunk_group) {
  const int world = group.getSize();
  const int rank = group.getRank();
  std::vector<std::vector<ManagedParam*>> members;
  std::int64_t segment = 0;  // elements of every member's segment
  for (const auto& member : chunk_group.members) {
    members.push_back(selected(member, stepped_by_owner));
    segment = std::max(segment, widened_segment_elements(members.back()));
  }
  if (segment == 0) return {};

  at::NoGradGuard no_grad;
  const at::ScalarType dtype = reduce_scatter_dtype(members);
  // Note [The device collectives take]
  const at::TensorOptions staging = at::TensorOptions(dtype).device(collective_device(group));
  at::Tensor send = at::empty({segment * world}, staging);
  for (int j = 0; j < world; ++j)
    pack_widened_gradients(members[static_cast<std::size_t>(j)],
                           send.narrow(0, segment * j, segment));
  std::vector<ManagedParam*> own = members[static_cast<std::size_t>(rank)];
  std::vector<PackedGradient> packed = packed_gradients(own);
  at::Tensor sum = at::empty({segment}, staging);
  const std::int64_t crossing =
      segment * (world - 1) * static_cast<std::int64_t>(c10::elementSize(dtype));
  PendingCollective collective =
      start_collective(group, "reducing gradients", CollectivePayload{crossing, crossing}, [&] {
        return group._reduce_scatter_base(sum, send,
                                          c10d::ReduceScatterOptions{c10d::ReduceOp::SUM});
      });
  drop_gradients_owned_elsewhere(chunks, members, rank);  // sent: the staging holds them

  return GroupReduction(
      std::move(collective), [send, sum, own = std::move(own), packed = std::move(packed), world] {
        at::NoGradGuard no_grad;
        std::int64_t values = 0;
        for (const ManagedParam* managed : own) values += elements(*managed);
        const at::Tensor mean = sum.narrow(0, 0, values).div_(static_cast<double>(world));
        const at::Tensor reached =
            sum.narrow(0, values, static_cast<std::int64_t>(own.size())).gt(0.5).cpu();
        const auto reached_by = reached.accessor<bool, 1>();
        std::int64_t offset = 0;
        for (std::size_t i = 0; i < own.size(); ++i) {
          set_reduced_gradient(packed[i], reached_by[static_cast<std::int64_t>(i)],
                               mean.narrow(0, offset, elements(*own[i])));
          offset += elements(*own[i]);
        }
      });
}

GroupReduction start_all_to_all(ChunkManager& chunks, c10d::ProcessGroup& group,
                                const ChunkGroup& chunk_group) {
  const int world = group.getSize();
  const int rank = group.getRank();
  std::vector<std::vector<ManagedParam*>> members;
  std::vector<SegmentLayout> layouts;
  std::vector<std::int64_t> segment;  // bytes of member j's segment
  std::int64_t total = 0;
  for (const auto& member : chunk_group.members) {
    members.push_back(selected(member, stepped_by_owner));
    layouts.push_back(segment_layout(members.back()));
    segment.push_back(layouts.back().bytes);
    total += layouts.back().bytes;
  }
  if (total == 0) return {};

  at::NoGradGuard no_grad;
  // Note [The device collectives take]
  const at::TensorOptions staging = at::TensorOptions(at::kByte).device(collective_device(group));
  at::Tensor send = at::empty({total}, staging);
  std::int64_t offset = 0;
  for (int j = 0; j < world; ++j) {
    const auto index = static_cast<std::size_t>(j);
    pack_gradients(layouts[index], send.narrow(0, offset, segment[index]));
    offset += segment[index];
  }
  std::vector<PackedGradient> packed = packed_gradients(members[static_cast<std::size_t>(rank)]);
  const std::int64_t own = segment[static_cast<std::size_t>(rank)];
  at::Tensor received = at::empty({own * world}, staging);
  std::vector<std::int64_t> output_splits(static_cast<std::size_t>(world), own);
  // Every segment crosses but this rank's own, sent and received alike.
  const CollectivePayload payload{total - own, own * (world - 1)};
  PendingCollective collective = start_collective(group, "reducing gradients", payload, [&] {
    return group.alltoall_base(received, send, output_splits, segment);
  });
  drop_gradients_owned_elsewhere(chunks, members, rank);  // sent: the staging holds them

  return GroupReduction(std::move(collective),
                        [layout = std::move(layouts[static_cast<std::size_t>(rank)]),
                         packed = std::move(packed), send, received, world] {
                          at::NoGradGuard no_grad;
                          write_means(layout, packed, received, world);
                        });
}

}  // namespace

GroupReduction::GroupReduction(PendingCollective collective, std::function<void()> write_means)
    : collective_(std::move(collective)), write_means_(std::move(write_means)) {}

void GroupReduction::finish() {
  if (!collective_) return;
  collective_->wait();
  collective_.reset();
  write_means_();
}

GroupReduction start_group_reduction(ChunkManager& chunks, c10d::ProcessGroup& group,
                                     const ChunkGroup& chunk_group) {
  GradientReduction reduction = data_parallel().reduction;
  if (reduction == GradientReduction::by_device)
    reduction = collective_device(group).is_cuda() ? GradientReduction::reduce_scatter
                                                   : GradientReduction::all_to_all;
  GroupReduction started = reduction == GradientReduction::reduce_scatter
                               ? start_reduce_scatter(chunks, group, chunk_group)
                               : start_all_to_all(chunks, group, chunk_group);
  // Packed: what backward writes from now on goes in the next reduction
  // (Note [A reduction sends what backward wrote since the last]).
  mark_gradients_reduced(chunk_group);
  return started;
}

namespace {

// Calls `visit` with every parameter of the layout; stops at the first
// that returns true, and says whether one did.
template <typename Visit>
bool any_param(const RankLayout& layout, Visit visit) {
  for (const ChunkGroup& chunk_group : layout.groups)
    for (const auto& member : chunk_group.members)
      for (const auto& managed : member)
        if (visit(*managed)) return true;
  return false;
}

// Whether backward wrote a gradient of the layout's parameters since its
// last reduction (Note [A reduction reduces what backward wrote since the
// last]).
bool gradients_unreduced(const RankLayout& layout) {
  return any_param(layout, [](const ManagedParam& managed) {
    return managed.gradient_unreduced.load(std::memory_order_acquire);
  });
}

c10::intrusive_ptr<c10d::ProcessGroup> current_group() {
  std::lock_guard lock(data_parallel().mutex);  // briefly: not the turn
  return data_parallel().group;
}

}  // namespace

void mark_gradients_reduced(const ChunkGroup& chunk_group) {
  for (const auto& member : chunk_group.members)
    for (const auto& managed : member)
      managed->gradient_unreduced.store(false, std::memory_order_release);
}

bool data_parallel_group_set() { return data_parallel().has_group.load(std::memory_order_acquire); }

namespace {
thread_local bool t_holds_turn = false;
}  // namespace

TurnLock::TurnLock() : lock_(data_parallel().mutex) { t_holds_turn = true; }
TurnLock::TurnLock(TurnLock&& other) noexcept : lock_(std::move(other.lock_)) {}
TurnLock::~TurnLock() {
  if (lock_.owns_lock()) t_holds_turn = false;
}
bool TurnLock::held_by_this_thread() { return t_holds_turn; }

CollectivesTurn take_collectives_turn() {
  TurnLock lock;
  c10::intrusive_ptr<c10d::ProcessGroup> group = data_parallel().group;
  return {std::move(lock), std::move(group)};
}

void begin_operation(c10d::ProcessGroup& group) {
  note_progress(group, ++data_parallel().operations);
}

namespace {

// Every rank takes the values of the parameters other ranks own, for every
// client or for `only`.
void gather_from_owners(ChunkManager& chunks, std::optional<ClientId> only) {
  close_owner_step();  // Note [Uses only the owner makes] (sharded_params.cc)
  const c10::intrusive_ptr<c10d::ProcessGroup> group = current_group();
  if (!group) return;
  TurnLock lock;
  begin_operation(*group);
  const std::vector<RankLayout> layouts = rank_layouts(chunks, group->getSize(), only);
  check_layouts_agree(*group, layouts);
  // Note [Parameters gathered for their use] (sharded_params.cc): with
  // sharded parameters, what this rank does not own is dropped instead.
  const bool sharded = parameters_sharded(*group);
  if (sharded) {
    end_interval(*group);
    gather_frozen_since_dropped(*group);
  }
  for (const RankLayout& layout : layouts) {
    if (!sharded)
      for (const ChunkGroup& chunk_group : layout.groups)
        gather_chunk_group(*group, chunk_group, stepped_by_owner);
    broadcast_from_rank_zero(*group, layout);
  }
  if (sharded) drop_gathered(chunks, *group, only);
}

}  // namespace

std::vector<std::optional<double>> owned_figures_everywhere(
    std::vector<std::optional<double>> figures, std::string_view what) {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = current_group();
  if (!group || group->getSize() == 1) return figures;
  TurnLock lock;
  begin_operation(*group);
  // Note [Per-parameter figures summed over owners]
  const auto count = static_cast<std::int64_t>(figures.size());
  at::Tensor sums = at::zeros({2 * count}, at::kDouble);
  double* values = sums.data_ptr<double>();
  for (std::int64_t i = 0; i < count; ++i) {
    if (!figures[static_cast<std::size_t>(i)].has_value()) continue;
    values[i] = *figures[static_cast<std::size_t>(i)];
    values[count + i] = 1;
  }
  std::vector<at::Tensor> tensors{sums.to(collective_device(*group))};
  run_collective(*group, fmt::format("summing {} over owners", what),
                 all_reduce_payload(sums.nbytes(), group->getSize()),
                 [&] { return group->allreduce(tensors); });
  sums = tensors[0].cpu();
  values = sums.data_ptr<double>();
  for (std::int64_t i = 0; i < count; ++i) {
    const double present = values[count + i];
    if (present > 1.5)
      throw std::runtime_error(fmt::format(
          "spillway data parallel: parameter #{} of the list has a gradient on {} ranks when "
          "taking {}: its gradients were not reduced to one owner. Is it managed, and was "
          "reduce_gradients() called after the last backward?",
          i, static_cast<int>(present + 0.5), what));
    figures[static_cast<std::size_t>(i)] =
        present > 0.5 ? std::optional<double>(values[i]) : std::nullopt;
  }
  return figures;
}

bool on_any_rank(bool condition, std::string_view what) {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = current_group();
  if (!group || group->getSize() == 1) return condition;
  TurnLock lock;
  begin_operation(*group);
  std::vector<at::Tensor> flag{at::full(
      {1}, condition ? 1 : 0, at::TensorOptions(at::kInt).device(collective_device(*group)))};
  run_collective(*group, fmt::format("asking every rank whether {}", what),
                 all_reduce_payload(flag[0].nbytes(), group->getSize()), [&] {
                   return group->allreduce(flag, c10d::AllreduceOptions{c10d::ReduceOp::MAX});
                 });
  return flag[0].item<int>() != 0;
}

void check_not_accumulating_onto_reduced(const ManagedParam& managed) {
  const c10::intrusive_ptr<c10::TensorImpl> reduced = managed.reduced_grad.lock();
  if (!reduced) return;
  const at::Tensor grad = managed.param.grad();
  if (!grad.defined() || grad.unsafeGetTensorImpl() != reduced.get() ||
      grad._version() != managed.reduced_grad_version + 1)
    return;
  throw std::runtime_error(fmt::format(
      "spillway data parallel: a backward added to the gradient of '{}' of model '{}' after "
      "it was reduced across ranks and before it was zeroed, so the next reduction would "
      "divide its mean by the world size again. When accumulating, run every micro-batch's "
      "backward but the last inside no_sync() (spillway::NoSync in C++), so that only the "
      "last one reduces; reduce (reduce_gradients(), clip_grad_norm_, a GradScaler's "
      "unscale_) only after it, and zero the gradients after each step. A second loss "
      "through a model already stepped (an actor's loss through its critic): zero that "
      "model's gradients before its backward, or freeze the model during it",
      tensor_name(active_chunk_manager(), managed.param_id), client_name(managed.client)));
}

void barrier(std::string_view what) {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = current_group();
  if (!group || group->getSize() == 1) return;
  TurnLock lock;
  begin_operation(*group);
  run_collective(*group, what, CollectivePayload{}, [&] { return group->barrier(); });
}

void join_data_parallel(ChunkManager& chunks, ClientId client) {
  gather_from_owners(chunks, client);
}

void gather_owned_parameters(ChunkManager& chunks) { gather_from_owners(chunks, std::nullopt); }

std::string data_parallel_backend_name() {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = current_group();
  return group ? group->getBackendName() : std::string();
}

void set_gradient_reduction(GradientReduction reduction) {
  std::lock_guard lock(data_parallel().mutex);
  data_parallel().reduction = reduction;
}

}  // namespace torch_bridge

void set_process_group(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  if (group && group->getSize() < 1)
    throw std::invalid_argument("spillway::set_process_group: the group has no ranks");
  // Refused here, not at the first reduction (Note [The device collectives take]).
  if (group) torch_bridge::collective_device(*group);
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  // Note [Parameters gathered for their use]: what this rank dropped comes
  // back through the group it was dropped in, before that group goes.
  torch_bridge::gather_everything_dropped();
  {
    std::lock_guard lock(torch_bridge::data_parallel().mutex);
    torch_bridge::data_parallel().has_group.store(group != nullptr, std::memory_order_release);
    torch_bridge::data_parallel().group = std::move(group);
  }
  torch_bridge::gather_owned_parameters(chunks);
}

namespace {

// The layouts of every client, or of those holding one of `params`.
void reduce_clients(const std::optional<std::vector<torch::Tensor>>& params) {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = torch_bridge::current_group();
  if (!group) return;
  ChunkManager& chunks = torch_bridge::active_chunk_manager();
  torch_bridge::TurnLock lock;
  torch_bridge::begin_operation(*group);
  // Every model's layout, as a backward compares them: Note [What each
  // rank is reducing for].
  const std::vector<torch_bridge::RankLayout> layouts =
      torch_bridge::rank_layouts(chunks, group->getSize());
  torch_bridge::check_layouts_agree(*group, layouts);
  std::set<ClientId> clients;
  if (params.has_value())
    for (const torch::Tensor& param : *params)
      if (const auto managed = torch_bridge::managed_param_bound_to(param))
        clients.insert(managed->client);
  const auto selected = [&](const torch_bridge::RankLayout& layout) {
    return !params.has_value() || clients.contains(layout.client);
  };
  // Note [A reduction reduces what backward wrote since the last]
  std::vector<std::int64_t> written;
  for (const torch_bridge::RankLayout& layout : layouts)
    written.push_back(selected(layout) && torch_bridge::gradients_unreduced(layout) ? 1 : 0);
  const at::Tensor all = torch_bridge::all_gather_reducing_for(
      *group, torch_bridge::ReducingFor::optimizer_step, layouts, written, {});
  const at::Tensor anyone = all.narrow(1, 0, static_cast<std::int64_t>(layouts.size())).amax(0);
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    if (anyone[static_cast<std::int64_t>(i)].item<std::int64_t>() == 0) continue;
    for (const torch_bridge::ChunkGroup& chunk_group : layouts[i].groups)
      torch_bridge::start_group_reduction(chunks, *group, chunk_group).finish();
  }
  // The optimizers' step comes next: Note [Uses only the owner makes]
  // (sharded_params.cc).
  torch_bridge::open_owner_step();
}

}  // namespace

void reduce_gradients() { reduce_clients(std::nullopt); }

void reduce_gradients(const std::vector<torch::Tensor>& params) { reduce_clients(params); }

int data_parallel_rank() {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = torch_bridge::current_group();
  return group ? group->getRank() : 0;
}

std::vector<int> data_parallel_owners(const std::vector<torch::Tensor>& tensors) {
  std::vector<int> owners(tensors.size(), -1);
  if (torch_bridge::binding_table().empty()) return owners;  // nothing managed
  const c10::intrusive_ptr<c10d::ProcessGroup> group = torch_bridge::current_group();
  std::map<const torch_bridge::ManagedParam*, int> owner_of;
  for (const torch_bridge::RankLayout& layout : torch_bridge::rank_layouts(
           torch_bridge::active_chunk_manager(), group ? group->getSize() : 1))
    for (const torch_bridge::ChunkGroup& chunk_group : layout.groups)
      for (std::size_t j = 0; j < chunk_group.members.size(); ++j)
        for (const auto& managed : chunk_group.members[j])
          owner_of.emplace(managed.get(), static_cast<int>(j));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    const auto managed = torch_bridge::managed_param_bound_to(tensors[i]);
    const auto owner = owner_of.find(managed.get());
    if (managed && owner != owner_of.end()) owners[i] = owner->second;
  }
  return owners;
}

int data_parallel_world_size() {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = torch_bridge::current_group();
  return group ? group->getSize() : 1;
}

}  // namespace spillway
