// Ownership of managed parameters across data-parallel ranks, and the check
// that every rank lays its models out the same way.
//
// Note [Chunk groups across ranks]
// Each model's parameter chunks, in the order the chunk manager made them,
// form groups of N (the world size): rank r owns chunk r of every group, and
// with it every parameter in that chunk, whole. The last group is padded
// with virtual chunks that hold nothing and are never allocated. Ownership
// follows the chunks, not the parameters, so that a rank's share of
// gradients, masters and optimizer state is whole chunks (1/N of them, to
// within one). It only means something if every rank packed the same
// parameters into the same chunks: check_layouts_agree compares a
// fingerprint of every layout across ranks, and on a mismatch finds the
// first parameter that differs, so the error names it.
//
// Note [Chunk groups of one size]
// Chunks are not all alike: a tensor larger than chunk_size has a chunk of
// its own, as large as the tensor. Grouped in the order they were made, a
// group would mix sizes, and the gathering, which pads every member to the
// group's largest, would send the difference; the owner of the large chunk
// would hold more state than the others. So a model's chunks are ordered by
// size, the largest first, before they are cut into groups, and among chunks
// of one size in the order they were made: the order is the same on every
// rank, and only the one group where two sizes meet, and the tail (whose
// chunks are the smallest), are uneven. On the demo's GPT scaled to 8 blocks
// of width 512 at N = 4 (bench_dp) this took each rank's traffic from 1.19
// of the minimum to 1.02, and the largest state share from 1.19 of 1/N to
// 1.03.
#include "hooks/torch/rank_layout.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "hooks/torch/client_names.h"
#include "hooks/torch/collective_wait.h"

namespace spillway::torch_bridge {

namespace {

// FNV-1a: the same on every rank, whatever the standard library's hash.
std::uint64_t fingerprint(const std::string& text) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string describe(const ManagedParam& managed, const TensorInfo& info, std::size_t chunk_index) {
  return fmt::format("'{}' ({} {}{}), chunk {} at offset {}", info.name,
                     std::string(c10::toString(managed.param.scalar_type())),
                     c10::str(managed.param.sizes()),
                     stepped_by_owner(managed) ? "" : ", not trained", chunk_index, info.offset);
}

constexpr std::string_view kComparingLayouts = "comparing the ranks' layouts";

}  // namespace

RowsInFlight::RowsInFlight(PendingCollective collective, std::vector<at::Tensor> rows)
    : collective_(std::move(collective)), rows_(std::move(rows)) {}

at::Tensor RowsInFlight::wait() {
  collective_.wait();
  return at::stack(rows_).cpu();
}

RowsInFlight start_all_gather_rows(c10d::ProcessGroup& group, const at::Tensor& row,
                                   std::string_view what) {
  // Note [The device collectives take]
  std::vector<at::Tensor> input{row.contiguous().to(collective_device(group))};
  // The output lists stay alive in the work; the rows are what they hold.
  std::vector<std::vector<at::Tensor>> output(1);
  for (int rank = 0; rank < group.getSize(); ++rank) output[0].push_back(at::empty_like(input[0]));
  std::vector<at::Tensor> rows = output[0];
  PendingCollective collective =
      start_collective(group, what, all_gather_payload(input[0].nbytes(), group.getSize()),
                       [&] { return group.allgather(output, input); });
  return {std::move(collective), std::move(rows)};
}

at::Tensor all_gather_rows(c10d::ProcessGroup& group, const at::Tensor& row,
                           std::string_view what) {
  return start_all_gather_rows(group, row, what).wait();
}

std::vector<RankLayout> rank_layouts(ChunkManager& chunks, int world_size,
                                     std::optional<ClientId> only) {
  std::map<ClientId, std::vector<std::shared_ptr<ManagedParam>>> by_client;
  for (auto& managed : binding_table().managed_params())
    if (!only.has_value() || managed->client == *only)
      by_client[managed->client].push_back(std::move(managed));

  std::vector<RankLayout> layouts;
  for (auto& [client, params] : by_client) {
    // The client's parameter chunks, the largest first, and in the order
    // they were made among chunks of one size (Note [Chunk groups of one
    // size]).
    std::vector<std::pair<std::size_t, ChunkId>> by_size;
    for (const ChunkId chunk : chunks.chunks_of(client)) {
      const std::optional<ChunkInfo> info = chunks.chunk_info(chunk);
      if (info.has_value() && info->kind == TensorKind::param)
        by_size.emplace_back(info->capacity_bytes, chunk);
    }
    std::stable_sort(by_size.begin(), by_size.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::map<ChunkId, std::size_t> chunk_index;
    for (const auto& [capacity, chunk] : by_size) chunk_index.emplace(chunk, chunk_index.size());
    struct Placed {
      std::size_t chunk;
      std::size_t offset;
      std::shared_ptr<ManagedParam> managed;
      TensorInfo info;
    };
    std::vector<Placed> placed;
    for (auto& managed : params) {
      give_gradient_if_unfrozen(chunks, managed);  // before anything is reduced
      std::optional<TensorInfo> info = chunks.tensor_info(managed->param_id);
      if (!info.has_value())
        continue;  // being dropped (Note [A parameter only the bridge holds goes])
      const auto index = chunk_index.find(info->chunk);
      if (index == chunk_index.end()) continue;
      placed.push_back({index->second, info->offset, managed, std::move(*info)});
    }
    std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
      return std::tie(a.chunk, a.offset) < std::tie(b.chunk, b.offset);
    });

    RankLayout layout;
    layout.client = client;
    layout.client_name = client_name(client);
    const std::size_t n = static_cast<std::size_t>(world_size);
    const std::size_t group_count = (chunk_index.size() + n - 1) / n;
    layout.groups.resize(group_count);
    for (ChunkGroup& group : layout.groups) group.members.resize(n);
    for (Placed& p : placed) {
      layout.descriptions.push_back(describe(*p.managed, p.info, p.chunk));
      layout.groups[p.chunk / n].members[p.chunk % n].push_back(std::move(p.managed));
    }
    layouts.push_back(std::move(layout));
  }
  return layouts;
}

void check_layouts_agree(c10d::ProcessGroup& group, const std::vector<RankLayout>& layouts) {
  // One line per parameter, each starting with its client's name.
  std::vector<std::string> lines;
  for (const RankLayout& layout : layouts)
    for (const std::string& description : layout.descriptions)
      lines.push_back(layout.client_name + ": " + description);
  std::vector<std::int64_t> hashes;
  std::uint64_t combined = 14695981039346656037ull;
  for (const std::string& line : lines) {
    hashes.push_back(static_cast<std::int64_t>(fingerprint(line)));
    combined = (combined ^ fingerprint(line)) * 1099511628211ull;
  }

  const at::Tensor summary = all_gather_rows(
      group,
      at::tensor({static_cast<std::int64_t>(lines.size()), static_cast<std::int64_t>(combined)},
                 at::kLong),
      kComparingLayouts);
  if (summary.eq(summary[0]).all().item<bool>()) return;

  // They differ: find the first line that does, with one more collective
  // that every rank takes part in, as every rank saw the mismatch.
  const std::int64_t longest = summary.select(1, 0).max().item<std::int64_t>();
  at::Tensor mine = at::zeros({longest + 1}, at::kLong);
  mine[0] = static_cast<std::int64_t>(lines.size());
  for (std::size_t i = 0; i < hashes.size(); ++i)
    mine[static_cast<std::int64_t>(i) + 1] = hashes[i];
  const at::Tensor all = all_gather_rows(group, mine, kComparingLayouts);
  const int rank = group.getRank();
  std::int64_t first = longest;
  int differing_rank = -1;
  for (int other = 1; other < group.getSize(); ++other) {
    const at::Tensor differs = all[other].slice(0, 1).ne(all[0].slice(0, 1)).nonzero();
    if (differs.numel() == 0 &&
        all[other][0].item<std::int64_t>() == all[0][0].item<std::int64_t>())
      continue;
    const std::int64_t index = differs.numel() > 0 ? differs[0][0].item<std::int64_t>()
                                                   : std::min(all[other][0].item<std::int64_t>(),
                                                              all[0][0].item<std::int64_t>());
    if (index < first) {
      first = index;
      differing_rank = other;
    }
  }
  const std::size_t at = static_cast<std::size_t>(first);
  const std::string here = at < lines.size() ? lines[at] : std::string("no parameter");
  throw std::runtime_error(fmt::format(
      "spillway data parallel: the ranks laid their models out differently; every rank must "
      "manage the same models, with the same parameters, in the same order. The first "
      "difference is at parameter #{} (rank {} differs from rank 0); on this rank (rank {}) "
      "it is {}. This rank has {} managed parameters, rank 0 has {}.",
      at, differing_rank, rank, here, lines.size(), all[0][0].item<std::int64_t>()));
}

}  // namespace spillway::torch_bridge
