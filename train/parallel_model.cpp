#include "train/parallel_model.h"

#include <cstdio>

#include "core/memory.h"
#include "dist/expert_parallel.h"
#include "dist/tp_plan.h"

namespace minidl::train {

ParallelModel build_model_and_sync(const TrainConfig& o, const nn::GPTConfig& model_cfg, const dist::Topology& topo,
                                   Device device, int64_t first_sample, const std::function<void(Stage&)>& load) {
  ParallelModel m;
  // The schedule is validated here, before anything is sent.
  const std::vector<int64_t> starts = pipeline_starts(o, model_cfg);
  Stage::ChunkFactory make_chunk;  // tensor parallelism, applied from outside the model
  if (topo.grid().tp > 1)
    make_chunk = [&topo, plan = dist::plan_for(model_cfg, o.sequence_parallel)](const nn::GPTConfig& c, uint64_t seed,
                                                                                const nn::GPTStage& part) {
      auto chunk = std::make_shared<nn::GPT>(c, seed, part);
      dist::apply_tensor_parallel(*chunk, topo.tp_group(), plan);
      return chunk;
    };
  if (topo.grid().ep > 1)  // expert parallelism, from outside the model as well: this rank's experts
    make_chunk = [&topo](const nn::GPTConfig& c, uint64_t seed, const nn::GPTStage& part) {
      auto chunk = std::make_shared<nn::GPT>(c, seed, part);
      dist::apply_expert_parallel(*chunk, topo.ep_group());
      return chunk;
    };
  m.stage = std::make_unique<Stage>(model_cfg, o.seed, pipeline_spec(o), starts, topo, make_chunk);
  const int64_t seq = o.seq ? *o.seq : model_cfg.block_size;  // the trained sequence length
  if (topo.grid().cp > 1)  // context parallelism, applied from outside the model too: each sequence over cp ranks
    m.stage->set_context_parallel(std::make_shared<dist::ContextParallel>(topo.cp_group(), seq));
  // A tensor-parallel rank built each chunk whole before keeping its slices: the peaks describe training.
  if (topo.grid().tp > 1 || topo.grid().ep > 1) ledger(Device::cpu()).reset_peaks();
  if (load) load(*m.stage);
  m.stage->to(device);  // before DDP's buckets, ZeRO's flat buffers and the optimizer: they follow the parameters
  m.stage->train();
  m.stage->set_dropout(0, first_sample);
  m.stage->set_recompute(nn::parse_recompute(o.recompute));
  SyncOptions sync;
  sync.zero = o.zero;
  if (o.powersgd_rank() > 0)
    sync.powersgd =
        dist::PowerSgdOptions{.rank = o.powersgd_rank(), .start_iter = o.powersgd_start.value_or(o.steps / 10)};
  else
    sync.compression = dist::compression(o.comm_hook);
  m.sync = std::make_unique<GradSync>(*m.stage, topo, sync);
  m.num_params = m.stage->num_parameters();
  if (o.pp > 1) m.notes.push_back(pipeline_note(o, starts));
  if (topo.grid().cp > 1)
    m.notes.push_back("context parallelism: ring attention over " + std::to_string(o.cp) + " ranks, " +
                      std::to_string(seq / o.cp) + " of " + std::to_string(seq) +
                      " positions per rank (chunks r and 2cp-1-r of 2cp)");
  if (topo.grid().ep > 1)
    m.notes.push_back("expert parallelism: " + std::to_string(model_cfg.moe_experts / o.ep) + " of " +
                      std::to_string(model_cfg.moe_experts) + " experts per rank, tokens exchanged over " +
                      std::to_string(o.ep) + " ranks");
  if (o.sequence_parallel) {
    m.notes.push_back("sequence parallelism: LayerNorm, dropout and the residual stream on " +
                      std::to_string(seq / o.tp) + " of " + std::to_string(seq) + " positions per rank");
  }
  return m;
}

dist::PipelineSpec pipeline_spec(const TrainConfig& c) {
  dist::PipelineSpec spec{dist::parse_schedule_kind(c.schedule), c.pp, int(c.micro_batches_or_default()),
                          c.virtual_stages};
  spec.validate();
  return spec;
}

std::vector<int64_t> pipeline_starts(const TrainConfig& c, const nn::GPTConfig& m) {
  const int chunks = c.pp * c.virtual_stages;
  if (chunks == 1) return {0, m.n_layer};
  if (!c.pp_layers.empty()) return dist::parse_layer_split(c.pp_layers, m.n_layer, chunks);
  // Parameters of one block (c_attn, c_proj, c_fc, c_proj and two LayerNorms), of the embeddings (wte, wpe) on the
  // first chunk and of ln_f plus the head (the tied wte again: the head's matmul is as much work) on the last.
  const int64_t C = m.n_embd, block = 12 * C * C + (m.bias ? 13 : 2) * C;
  return dist::split_layers(m.n_layer, chunks, block, m.vocab_size * C + m.block_size * C,
                            (m.bias ? 2 : 1) * C + m.vocab_size * C);
}

void validate_pipeline(const TrainConfig& c, int d) {
  MINIDL_CHECK(!c.micro_batches || *c.micro_batches >= 1, "--micro-batches (--grad-accum): expected at least 1, got ",
               c.micro_batches.value_or(0));
  MINIDL_CHECK(c.virtual_stages >= 1, "--virtual-stages: expected at least 1, got ", c.virtual_stages);
  if (c.pp == 1) {
    MINIDL_CHECK(c.virtual_stages == 1, "--virtual-stages needs --pp > 1 and --schedule interleaved");
    MINIDL_CHECK(c.pp_layers.empty(), "--pp-layers needs --pp > 1");
  }
  MINIDL_CHECK(c.zero <= 2 || c.pp == 1, "--zero ", c.zero, " with --pp ", c.pp,
               ": ZeRO-3 shards the parameters "
               "each block gathers just before use, which a pipeline stage's interleaved micro-batches would gather "
               "and free again and again (DeepSpeed refuses it too); use --zero 1 or 2 with --pp");
  pipeline_spec(c);
  const int64_t M = c.micro_batches_or_default();
  MINIDL_CHECK(c.batch % (int64_t(d) * M) == 0, "--batch ", c.batch, " does not split into ", d,
               " data-parallel rank(s) x ", M, " micro-batches",
               c.micro_batches ? " (--micro-batches / --grad-accum " + std::to_string(M) + ")"
                               : std::string(" (--micro-batches default: --pp)"),
               " of equal size: --batch must be a multiple of ", int64_t(d) * M);
  const int64_t layers = c.layers_or_default(), chunks = int64_t(c.pp) * c.virtual_stages;
  MINIDL_CHECK(layers >= chunks, "--pp ", c.pp,
               c.virtual_stages > 1 ? " x --virtual-stages " + std::to_string(c.virtual_stages) : std::string(), " = ",
               chunks,
               " pipeline stages but the model has "
               "only ",
               layers, " blocks (--layers): every stage needs at least one block");
  if (!c.pp_layers.empty()) dist::parse_layer_split(c.pp_layers, layers, int(chunks));
}

std::string pipeline_note(const TrainConfig& c, const std::vector<int64_t>& starts) {
  dist::PipelineSpec spec = pipeline_spec(c);
  dist::SimResult sim = dist::simulate(dist::make_schedule(spec));
  std::string blocks;
  for (size_t i = 0; i + 1 < starts.size(); ++i) {
    if (i) blocks += ',';
    blocks += std::to_string(starts[i + 1] - starts[i]);
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "pipeline: schedule %s, %d micro-batches, %d chunk(s) per rank, blocks per chunk %s; "
                "simulated bubble %.1f%% (formula %.1f%%)",
                dist::schedule_kind_name(spec.kind), spec.micro_batches, spec.virtual_stages, blocks.c_str(),
                100 * sim.bubble_fraction(), 100 * dist::bubble_formula(spec));
  return line;
}

std::string describe_pipeline(const TrainConfig& c) {
  MINIDL_CHECK(c.pp > 1, "--print-schedule needs --pp > 1, got --pp ", c.pp);
  nn::GPTConfig m{.vocab_size = 65,
                  .block_size = c.seq_or_default(),
                  .n_layer = c.layers_or_default(),
                  .n_head = c.heads_or_default(),
                  .n_embd = c.embd_or_default()};
  return pipeline_note(c, pipeline_starts(c, m)) + " (vocab 65 assumed for the split)\n" +
         dist::draw_schedule(dist::make_schedule(pipeline_spec(c)));
}

}  // namespace minidl::train
