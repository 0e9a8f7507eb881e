#include "train/parallel_model.h"

#include "dist/tp_gpt.h"
#include "train/tp_sync.h"
#include "train/trainer_pipeline.h"
#include "train/zero3_sync.h"
#include "train/zero_sync.h"

namespace minidl::train {

std::vector<std::pair<std::string, Tensor>> ParallelModel::named_parameters() const {
  return pipe ? pipe->named_parameters() : model->named_parameters();
}

namespace {

// pp > 1: this rank's chunks (tensor-parallel ones with tp > 1) and the pipeline's synchronisation.
void build_pipeline(ParallelModel& m, const TrainConfig& o, const nn::GPTConfig& model_cfg,
                    const dist::Topology& topo, Device device, int64_t first_sample,
                    const std::function<void(PipelineModel&)>& load) {
  // The schedule is validated here, before anything is sent.
  const std::vector<int64_t> starts = pipeline_starts(o, model_cfg);
  m.pipe = std::make_unique<PipelineModel>(model_cfg, o.seed, pipeline_spec(o), starts, topo, o.sequence_parallel);
  if (load) load(*m.pipe);
  m.pipe->to(device);  // before ZeRO's flat buffers, which follow the parameters' device
  m.pipe->train();
  m.pipe->set_dropout(0, first_sample);
  m.pipe->set_recompute(nn::parse_recompute(o.recompute));
  m.sync = std::make_unique<PipelineSync>(*m.pipe, topo, o.zero);
  m.num_params = m.pipe->num_parameters();
  m.notes.push_back(pipeline_note(o, starts));
}

// pp = 1: the whole model (split over the tp group with tp > 1) and its data-parallel strategy.
void build_whole(ParallelModel& m, const TrainConfig& o, const nn::GPTConfig& model_cfg, const dist::Topology& topo,
                 Device device, int64_t first_sample, const std::function<void(nn::GPT&)>& load) {
  const dist::Grid& grid = topo.grid();
  if (grid.tp > 1)  // the same weights, split over the tp group (dist/tp_gpt.h)
    m.model = std::make_unique<dist::TensorParallelGPT>(model_cfg, o.seed, topo.tp_group(), o.sequence_parallel);
  else
    m.model = std::make_unique<nn::GPT>(model_cfg, o.seed);
  if (load) load(*m.model);  // before ZeRO shards the parameters
  m.model->to(device);       // before DDP and the optimizer, whose buffers follow the parameters' device
  m.model->train();
  m.num_params = m.model->num_parameters();
  if (auto* split = dynamic_cast<dist::TensorParallelGPT*>(m.model.get()))
    m.num_params = split->logical_num_parameters();
  m.model->dropout_context().first_sample = first_sample;
  m.model->set_recompute(nn::parse_recompute(o.recompute));
  if (o.zero == 3)
    m.sync = std::make_unique<Zero3Sync>(*m.model, topo);
  else if (o.zero > 0)  // at dp 1 too: the same code path, with shards of the whole bucket
    m.sync = std::make_unique<ZeroSync>(*m.model, topo, o.zero);
  else if (grid.dp > 1)
    m.sync = std::make_unique<DDPSync>(*m.model, topo);
  else if (grid.tp > 1)
    m.sync = std::make_unique<ModelParallelSync>(topo);
  else
    m.sync = std::make_unique<GradSync>();
}

}  // namespace

ParallelModel build_model_and_sync(const TrainConfig& o, const nn::GPTConfig& model_cfg,
                                   const dist::Topology& topo, Device device, int64_t first_sample,
                                   const std::function<void(nn::GPT&)>& load,
                                   const std::function<void(PipelineModel&)>& load_stage) {
  ParallelModel m;
  const dist::Grid& grid = topo.grid();
  if (grid.pp > 1)
    build_pipeline(m, o, model_cfg, topo, device, first_sample, load_stage);
  else
    build_whole(m, o, model_cfg, topo, device, first_sample, load);
  if (grid.tp > 1) {
    const int64_t seq = o.seq ? *o.seq : model_cfg.block_size;  // the trained sequence length
    if (o.sequence_parallel)
      m.notes.push_back("sequence parallelism: LayerNorm, dropout and the residual stream on " +
                        std::to_string(seq / grid.tp) + " of " + std::to_string(seq) + " positions per rank");
    if (m.pipe)
      m.sync = std::make_unique<TensorParallelSync>(std::move(m.sync), m.pipe->parameters(),
                                                    m.pipe->replicated_parameters(), o.sequence_parallel, topo);
    else  // the whole model's: it also gathers checkpoints
      m.sync = std::make_unique<TensorParallelSync>(
          std::move(m.sync), static_cast<const dist::TensorParallelGPT&>(*m.model), topo);
  }
  return m;
}

}  // namespace minidl::train
