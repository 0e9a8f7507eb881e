#include "train/stage.h"

#include "dist/tp_gpt.h"
#include "train/grad_sync.h"

namespace minidl::train {

Stage::Stage(const dist::PipelineSpec& spec, const dist::Topology* topology)
    : topology_(topology), schedule_(dist::make_schedule(spec)), rank_(topology ? topology->coord().pp : 0) {}

Stage::Stage(const nn::GPTConfig& cfg, uint64_t seed, const dist::PipelineSpec& spec,
             const std::vector<int64_t>& starts, const dist::Topology& topology, bool sequence_parallel)
    : Stage(spec, &topology) {
  MINIDL_CHECK(spec.stages == topology.grid().pp, "pipeline: the schedule has ", spec.stages,
               " stages but the topology ", topology.grid().pp);
  MINIDL_CHECK(int64_t(starts.size()) == spec.chunks() + 1, "pipeline: expected ", spec.chunks() + 1,
               " block boundaries, got ", starts.size());
  dist::validate_schedule(schedule_);
  sequence_parallel_ = sequence_parallel && topology.grid().tp > 1;
  const int C = spec.chunks();
  for (int v = 0; v < spec.virtual_stages; ++v) {
    const int64_t c = global_chunk(v);
    const nn::GPTStage part{starts[size_t(c)], starts[size_t(c) + 1], c == 0, c == C - 1};
    if (topology.grid().tp > 1) {
      auto split = std::make_shared<dist::TensorParallelGPT>(cfg, seed, topology.tp_group(), sequence_parallel_, part);
      add_chunk(split, split.get());
    } else {
      add_chunk(std::make_shared<nn::GPT>(cfg, seed, part), nullptr);
    }
  }
}

Stage Stage::of(nn::GPT& model, int micro_batches) { return of(model, nullptr, micro_batches); }
Stage Stage::of(dist::TensorParallelGPT& model, int micro_batches) { return of(model, &model, micro_batches); }

Stage Stage::of(nn::GPT& model, dist::TensorParallelGPT* split, int micro_batches) {
  Stage s({dist::ScheduleKind::k1F1B, 1, micro_batches, 1}, nullptr);
  s.sequence_parallel_ = split && split->sequence_parallel();
  s.add_chunk(std::shared_ptr<nn::GPT>(&model, [](nn::GPT*) {}), split);  // not owned
  return s;
}

void Stage::add_chunk(std::shared_ptr<nn::GPT> chunk, dist::TensorParallelGPT* split) {
  if (split) {
    tp_ = split->group().size();
    for (const Tensor& p : split->replicated_parameters()) replicated_.insert(p.impl());
  }
  if (spec().stages > 1 && (chunk->stage().embedding || chunk->stage().head)) {
    // The tied wte: the embedding's (vocabulary-parallel at tp > 1) on the first stage, the head's on the last.
    tied_weight_ = split ? split->vocab_embedding->weight : chunk->wte->weight;
    if (!chunk->stage().embedding) tied_copy_ = tied_weight_;
  }
  chunks_.push_back(std::move(chunk));
  splits_.push_back(split);
}

std::vector<std::pair<std::string, Tensor>> Stage::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& c : chunks_)
    for (auto& np : c->named_parameters()) out.push_back(np);
  return out;
}

std::vector<Tensor> Stage::parameters() const {
  std::vector<Tensor> out;
  for (auto& np : named_parameters()) out.push_back(np.second);
  return out;
}

Shape Stage::logical_shape(int v, const std::string& name, const Tensor& p) const {
  return split(v) ? split(v)->layout(name).full_shape : p.shape();
}

bool Stage::owns(const std::string& name) const { return name != "transformer.wte.weight" || first_stage(); }

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
  for (int v = 0; v < chunk_count(); ++v)
    n += split(v) ? split(v)->logical_num_parameters() : chunk(v).num_parameters();
  if (tied_copy_.defined()) n -= config().vocab_size * config().n_embd;  // the first stage counts wte
  return pp_group() ? int64_t(sum_over(*pp_group(), double(n))) : n;
}

double Stage::flops_per_token(int64_t T) const {
  // nanoGPT's 6·N + 12·L·C·T (nn::GPT::flops_per_token) with N the whole model's parameters without wpe.
  const nn::GPTConfig& c = config();
  const double n = double(num_parameters() - c.block_size * c.n_embd);
  return 6.0 * n + 12.0 * double(c.n_layer) * double(c.n_embd) * double(T);
}

}  // namespace minidl::train
