#include "train/stage.h"

#include "nn/moe.h"

#include "nn/param_layout.h"
#include "train/grad_sync.h"

namespace minidl::train {

Stage::Stage(const dist::PipelineSpec& spec, const dist::Topology* topology)
    : topology_(topology), schedule_(dist::make_schedule(spec)), rank_(topology ? topology->coord().pp : 0) {}

Stage::Stage(const nn::GPTConfig& cfg, uint64_t seed, const dist::PipelineSpec& spec,
             const std::vector<int64_t>& starts, const dist::Topology& topology, const ChunkFactory& make_chunk)
    : Stage(spec, &topology) {
  MINIDL_CHECK(spec.stages == topology.grid().pp, "pipeline: the schedule has ", spec.stages,
               " stages but the topology ", topology.grid().pp);
  MINIDL_CHECK(int64_t(starts.size()) == spec.chunks() + 1, "pipeline: expected ", spec.chunks() + 1,
               " block boundaries, got ", starts.size());
  dist::validate_schedule(schedule_);
  MINIDL_CHECK(topology.grid().tp == 1 || make_chunk, "Stage: tp ", topology.grid().tp,
               " needs a chunk factory that splits each chunk (train::build_model_and_sync passes one)");
  const int C = spec.chunks();
  for (int v = 0; v < spec.virtual_stages; ++v) {
    const int64_t c = global_chunk(v);
    const nn::GPTStage part{starts[size_t(c)], starts[size_t(c) + 1], c == 0, c == C - 1};
    add_chunk(make_chunk ? make_chunk(cfg, seed, part) : std::make_shared<nn::GPT>(cfg, seed, part));
  }
}

Stage Stage::of(nn::GPT& model, int micro_batches) {
  Stage s({dist::ScheduleKind::k1F1B, 1, micro_batches, 1}, nullptr);
  s.add_chunk(std::shared_ptr<nn::GPT>(&model, [](nn::GPT*) {}));  // not owned
  return s;
}

void Stage::add_chunk(std::shared_ptr<nn::GPT> chunk) {
  const auto named = chunk->named_parameters();
  for (const auto& [name, p] : named)  // what crosses a boundary is as sliced as the parameters acting on it
    if (const nn::ParamLayout l = nn::layout_of(p); l.sequence_sliced) sequence_shards_ = l.ranks;
  if (spec().stages > 1 && chunk->config().tie_embeddings && (chunk->stage().embedding || chunk->stage().head)) {
    // The tied wte (vocabulary-parallel at tp > 1): the embedding's on the first stage, the head's on the last.
    for (const auto& [name, p] : named)
      if (name == "transformer.wte.weight") tied_weight_ = p;
    MINIDL_ASSERT(tied_weight_.defined(), "Stage: a chunk with the embedding or the head has no wte");
    if (!chunk->stage().embedding) tied_copy_ = tied_weight_;
  }
  chunks_.push_back(std::move(chunk));
}

std::vector<std::pair<std::string, Tensor>> Stage::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& c : chunks_)
    for (auto& np : c->named_parameters()) out.push_back(np);
  return out;
}

bool Stage::expert_parallel() const {
  for (const auto& c : chunks_)
    for (const nn::MoE* moe : nn::moe_layers(*c))
      if (moe->style) return true;
  return false;
}

std::vector<Tensor> Stage::parameters() const {
  std::vector<Tensor> out;
  for (auto& np : named_parameters()) out.push_back(np.second);
  return out;
}

bool Stage::owns(const std::string& name) const { return name != "transformer.wte.weight" || first_stage(); }

void Stage::set_context_parallel(std::shared_ptr<const dist::ContextParallel> cp) {
  MINIDL_CHECK(!cp_, "Stage::set_context_parallel: the stage's chunks already run context parallelism");
  if (!cp || cp->size() == 1) return;
  for (auto& c : chunks_) dist::apply_context_parallel(*c, *cp);
  cp_ = std::move(cp);
}

void Stage::to(Device device) {
  for (auto& c : chunks_) c->to(device);
}
void Stage::train(bool on) {
  for (auto& c : chunks_) c->train(on);
}
void Stage::set_recompute(nn::Recompute r) {
  for (auto& c : chunks_) c->set_recompute(r);
}

void Stage::set_dropout(uint64_t step, int64_t first_sample) {
  for (auto& c : chunks_) {
    c->dropout_context().step = step;
    c->dropout_context().first_sample = first_sample;
  }
}

int64_t Stage::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += nn::layout_of(p).full_numel();  // whole tensors, wte once a chunk
  if (tied_copy_.defined()) n -= config().vocab_size * config().n_embd;     // the first stage counts wte
  return pp_group() ? int64_t(sum_over(*pp_group(), double(n))) : n;
}

double Stage::flops_per_token(int64_t T) const {
  // nanoGPT's 6·N + 12·L·C·T (nn::GPT::flops_per_token) with N the whole model's parameters without wpe.
  const nn::GPTConfig& c = config();
  const double n = double(num_parameters() - c.block_size * c.n_embd);
  return 6.0 * n + 12.0 * double(c.n_layer) * double(c.n_embd) * double(T);
}

}  // namespace minidl::train
