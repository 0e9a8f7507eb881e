#include "dist/zero_state.h"

namespace minidl::dist {

std::vector<Tensor> gather_logical(Reducer& reducer, const std::vector<ShardPiece>& pieces,
                                   const std::vector<Tensor>& values, const std::vector<bool>& keep) {
  MINIDL_ASSERT(values.size() == pieces.size(), "gather_logical: ", values.size(), " values for ", pieces.size(),
                " pieces");
  ProcessGroup& group = reducer.group();
  const std::vector<Tensor>& params = reducer.params();
  MINIDL_ASSERT(keep.size() == params.size(), "gather_logical: ", keep.size(), " flags for ", params.size(),
                " parameters");
  std::vector<Tensor> logical(params.size());
  for (size_t b = 0; b < reducer.buckets().size(); ++b) {
    const BucketSpec& spec = reducer.buckets()[b];
    const int64_t padded = reducer.padded_numel(b), shard = padded / group.size(), first = group.rank() * shard;
    Tensor mine = Tensor::zeros({shard}, spec.dtype, group.device());
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].bucket != b) continue;
      MINIDL_ASSERT(values[i].numel() == pieces[i].numel, "gather_logical: piece ", i, " has ", pieces[i].numel,
                    " elements, its value ", values[i].numel());
      mine.narrow(0, pieces[i].begin - first, pieces[i].numel).copy_(values[i].reshape({pieces[i].numel}));
    }
    Tensor whole = Tensor::zeros({padded}, spec.dtype, group.device());
    group.all_gather(whole, mine)->wait();
    for (size_t s = 0; s < spec.params.size(); ++s) {
      if (!keep[spec.params[s]]) continue;
      const Tensor& p = params[spec.params[s]];
      logical[spec.params[s]] = whole.narrow(0, spec.offsets[s], p.numel()).reshape(p.shape()).clone();
    }
  }
  return logical;
}

std::vector<Tensor> slice_logical(const Reducer& reducer, const std::vector<ShardPiece>& pieces,
                                  const std::vector<Tensor>& logical) {
  MINIDL_ASSERT(logical.size() == reducer.params().size(), "slice_logical: ", logical.size(), " tensors for ",
                reducer.params().size(), " parameters");
  std::vector<Tensor> out;
  out.reserve(pieces.size());
  for (const ShardPiece& piece : pieces) {
    const BucketSpec& spec = reducer.buckets()[piece.bucket];
    const Tensor& whole = logical[spec.params[piece.slot]];
    out.push_back(whole.reshape({whole.numel()}).narrow(0, piece.begin - spec.offsets[piece.slot], piece.numel));
  }
  return out;
}

}  // namespace minidl::dist
