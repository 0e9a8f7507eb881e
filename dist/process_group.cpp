#include "dist/process_group.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>

#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "dist/mpi_backend.h"
#include "dist/reduce.h"
#include "dist/ring_backend.h"

namespace minidl::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

namespace {

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

// Runs `finish` once, after `inner` completes: the step that copies a staged result back into the caller's tensor.
class ThenWork final : public Work {
 public:
  ThenWork(std::shared_ptr<Work> inner, std::function<void()> finish)
      : inner_(std::move(inner)), finish_(std::move(finish)) {}
  void wait() override {
    inner_->wait();
    run_finish();
  }
  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    run_finish();
    return true;
  }

 private:
  void run_finish() {
    if (finish_) std::exchange(finish_, nullptr)();
  }
  std::shared_ptr<Work> inner_;
  std::function<void()> finish_;
};

// A Work whose completion (or failure) is reported to the flight recorder.
class RecordedWork final : public Work {
 public:
  RecordedWork(std::shared_ptr<Work> inner, int64_t id) : inner_(std::move(inner)), id_(id) {}
  ~RecordedWork() override {
    if (!done_) record_done(id_, FlightEntry::State::kDropped);
  }
  void wait() override {
    try {
      inner_->wait();
    } catch (...) {
      finish(FlightEntry::State::kFailed);
      throw;
    }
    finish(FlightEntry::State::kCompleted);
  }
  bool is_completed() override {
    const bool completed = inner_->is_completed();
    if (completed) finish(FlightEntry::State::kCompleted);
    return completed;
  }

 private:
  void finish(FlightEntry::State state) {
    if (!std::exchange(done_, true)) record_done(id_, state);
  }
  std::shared_ptr<Work> inner_;
  int64_t id_;
  bool done_ = false;
};

bool is_half(DType dt) { return dt == DType::f16 || dt == DType::bf16; }

// True when the byte ranges of two contiguous tensors intersect.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.shares_storage(b)) return false;
  auto begin_a = a.impl()->offset, begin_b = b.impl()->offset;
  return begin_a < begin_b + int64_t(b.nbytes()) && begin_b < begin_a + int64_t(a.nbytes());
}

// A contiguous copy of t as `dtype`, charged to the comm-buffer ledger (raw: never recorded by autograd). On a
// device the f32 staging copy of an f16/bf16 tensor is made by a device kernel (dist/reduce.h).
Tensor comm_copy(const Tensor& t, DType dtype) {
  MemoryTagGuard tag(MemTag::kComm);
  Tensor copy = Tensor::empty(t.shape(), dtype, t.device());
  convert_into(copy, t);
  return copy;
}

// A staging buffer the collective will overwrite: nothing to convert into it.
Tensor comm_buffer(const Tensor& t, DType dtype) {
  MemoryTagGuard tag(MemTag::kComm);
  return Tensor::empty(t.shape(), dtype, t.device());
}

}  // namespace

std::shared_ptr<Work> completed_work() {
  static const auto done = std::make_shared<CompletedWork>();
  return done;
}

std::vector<int> ProcessGroup::world_ranks() const {
  if (!world_ranks_.empty()) return world_ranks_;
  std::vector<int> ranks(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) ranks[size_t(r)] = r;
  return ranks;
}

ProcessGroup::~ProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (check_comm_ && !finalized) MPI_Comm_free(&check_comm_);
}

namespace {

std::atomic<bool> g_check_collectives{false};

// Every operation the fingerprints name (an op missing here named a null string: op_code -1).
const char* const kOps[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                            "send",       "recv",           "barrier",    "all_to_all"};

int64_t op_code(const char* op) {
  for (int64_t i = 0; i < int64_t(std::size(kOps)); ++i)
    if (std::string(op) == kOps[i]) return i;
  MINIDL_ASSERT(false, "--check-collectives: no fingerprint code for operation '", op, "' (add it to kOps)");
}

// A call's fingerprint: what every rank of a collective (or both ends of a message) must agree on.
struct Fingerprint {
  int64_t seq, op, dtype, count, peer, reduce;
  bool operator==(const Fingerprint&) const = default;
  std::string text() const {
    std::string s = kOps[op];
    if (op != 6) s += std::string(" ") + dtype_name(DType(dtype)) + " x " + std::to_string(count);
    if (reduce >= 0) s += std::string(" (") + reduce_op_name(ReduceOp(reduce)) + ")";
    if (peer >= 0) s += (op == 3 ? " root " : " peer ") + std::to_string(peer);
    return s;
  }
};

}  // namespace

void set_checking_collectives(bool on) { g_check_collectives = on; }
bool checking_collectives() { return g_check_collectives; }

void ProcessGroup::check_fingerprint(const char* op, const Tensor& t, int peer, const char* reduce_op, int tag) {
  const bool p2p = tag >= 0;
  int64_t reduce = -1;
  for (ReduceOp r : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax})
    if (reduce_op && std::string(reduce_op) == reduce_op_name(r)) reduce = int64_t(r);
  const Fingerprint mine{p2p ? 0 : ++checked_seq_,    op_code(op), t.defined() ? int64_t(t.dtype()) : 0,
                         t.defined() ? t.numel() : 0, peer,        reduce};
  const std::string where = "--check-collectives: group " + label() + " (" + name() + ", rank " +
                            std::to_string(rank()) + " of " + std::to_string(size()) + ")";
  if (p2p) {
    // The sender tells, the receiver compares: a message's fingerprint travels ahead of it with the same tag.
    if (std::string(op) == "send") {
      MINIDL_MPI_CHECK(MPI_Send(&mine, 6, MPI_INT64_T, peer, tag, check_comm_));
      return;
    }
    Fingerprint theirs{};
    MINIDL_MPI_CHECK(MPI_Recv(&theirs, 6, MPI_INT64_T, peer, tag, check_comm_, MPI_STATUS_IGNORE));
    MINIDL_CHECK(theirs.dtype == mine.dtype && theirs.count == mine.count, where, ": tag ", tag, ": rank ", rank(),
                 " receives ", dtype_name(DType(mine.dtype)), " x ", mine.count, " but rank ", peer, " sends ",
                 dtype_name(DType(theirs.dtype)), " x ", theirs.count);
    return;
  }
  std::vector<Fingerprint> all(static_cast<size_t>(size()));
  MINIDL_MPI_CHECK(MPI_Allgather(&mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, check_comm_));
  // Every rank holds the same table: every rank throws the same message, or none does.
  std::vector<std::pair<Fingerprint, std::string>> distinct;
  for (int r = 0; r < size(); ++r) {
    auto it = std::find_if(distinct.begin(), distinct.end(), [&](const auto& d) { return d.first == all[size_t(r)]; });
    if (it == distinct.end())
      distinct.push_back({all[size_t(r)], std::to_string(r)});
    else
      it->second.append(",").append(std::to_string(r));
  }
  if (distinct.size() == 1) return;
  std::string calls;
  for (const auto& [f, ranks] : distinct) {
    if (!calls.empty()) calls += "; ";
    calls.append("ranks ").append(ranks).append(" call sequence ").append(std::to_string(f.seq)).append(": ");
    calls += f.text();
  }
  throw Error(::minidl::detail::concat(where, ": the ranks disagree on collective ", mine.seq, ": ", calls));
}

template <class Call>
std::shared_ptr<Work> ProcessGroup::recorded(const char* op, const Tensor& t, int peer, const char* reduce_op,
                                             Call call, int tag) {
  const int64_t id =
      record_call(*this, op, t.defined() ? t.dtype() : DType::u8, t.defined() ? t.numel() : 0, peer, reduce_op);
  try {
    // On record first, so the watchdog sees a fingerprint exchange that some rank never joins.
    if (check_comm_) check_fingerprint(op, t, peer, reduce_op, tag);
    return std::make_shared<RecordedWork>(call(), id);
  } catch (...) {
    record_done(id, FlightEntry::State::kFailed);
    throw;
  }
}

void ProcessGroup::unsupported(const char* op) const {
  throw Error(::minidl::detail::concat("backend ", name(), " does not support ", op));
}

void ProcessGroup::check_tensor(const char* op, const Tensor& t) const {
  MINIDL_CHECK(t.defined(), name(), " ", op, ": undefined tensor");
  MINIDL_CHECK(t.device() == device(), name(), " ", op, ": expected a tensor on ", device(), ", got one on ",
               t.device());
  MINIDL_CHECK(t.is_contiguous(), name(), " ", op, ": expected a contiguous tensor, got shape ", t.shape(),
               " with strides ", t.strides());
}

std::shared_ptr<Work> ProcessGroup::all_reduce(Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  if (tensor.numel() == 0) return completed_work();
  all_reduce_bytes_ += uint64_t(tensor.numel()) * (is_half(tensor.dtype()) ? 4 : dtype_size(tensor.dtype()));
  return recorded("all_reduce", tensor, -1, reduce_op_name(op), [&]() -> std::shared_ptr<Work> {
    if (!is_half(tensor.dtype())) return do_all_reduce(tensor, op);
    Tensor staged = comm_copy(tensor, DType::f32);
    return std::make_shared<ThenWork>(do_all_reduce(staged, op),
                                      [tensor, staged]() mutable { convert_into(tensor, staged); });
  });
}

std::shared_ptr<Work> ProcessGroup::all_reduce_16bit(Tensor& tensor, ReduceOp op) {
  if (!is_half(tensor.dtype())) return all_reduce(tensor, op);
  check_tensor("all_reduce_16bit", tensor);
  MINIDL_CHECK(op == ReduceOp::kSum, name(), " all_reduce_16bit: expected sum (divide first for a mean), got ",
               reduce_op_name(op));
  if (tensor.numel() == 0) return completed_work();
  all_reduce_bytes_ += tensor.nbytes();
  return recorded("all_reduce", tensor, -1, reduce_op_name(op), [&] { return do_all_reduce_16bit(tensor, op); });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor("reduce_scatter", output);
  check_tensor("reduce_scatter", input);
  MINIDL_CHECK(input.dtype() == output.dtype(), name(), " reduce_scatter: input is ", input.dtype(), ", output is ",
               output.dtype());
  MINIDL_CHECK(input.numel() == output.numel() * size(), name(), " reduce_scatter: input must hold size() = ", size(),
               " times the output's ", output.numel(), " elements, got ", input.numel());
  if (output.numel() == 0) return completed_work();
  return recorded("reduce_scatter", input, -1, reduce_op_name(op), [&]() -> std::shared_ptr<Work> {
    if (is_half(input.dtype())) {
      Tensor staged_out = comm_buffer(output, DType::f32);  // not comm_copy: initcheck saw it read unwritten memory
      auto inner = do_reduce_scatter(staged_out, comm_copy(input, DType::f32), op);
      return std::make_shared<ThenWork>(inner, [output, staged_out]() mutable { convert_into(output, staged_out); });
    }
    return do_reduce_scatter(output, overlaps(output, input) ? comm_copy(input, input.dtype()) : input, op);
  });
}

std::shared_ptr<Work> ProcessGroup::all_gather(Tensor& output, const Tensor& input) {
  check_tensor("all_gather", output);
  check_tensor("all_gather", input);
  MINIDL_CHECK(input.dtype() == output.dtype(), name(), " all_gather: input is ", input.dtype(), ", output is ",
               output.dtype());
  MINIDL_CHECK(output.numel() == input.numel() * size(), name(), " all_gather: output must hold size() = ", size(),
               " times the input's ", input.numel(), " elements, got ", output.numel());
  if (input.numel() == 0) return completed_work();
  return recorded("all_gather", output, -1, nullptr, [&] {
    return do_all_gather(output, overlaps(output, input) ? comm_copy(input, input.dtype()) : input);
  });
}

std::shared_ptr<Work> ProcessGroup::broadcast(Tensor& tensor, int root) {
  check_tensor("broadcast", tensor);
  MINIDL_CHECK(root >= 0 && root < size(), name(), " broadcast: root ", root, " is not a rank of this group of ",
               size());
  if (tensor.numel() == 0) return completed_work();
  return recorded("broadcast", tensor, root, nullptr, [&] { return do_broadcast(tensor, root); });
}

std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor& output, const Tensor& input,
                                               const std::vector<int64_t>& send_counts,
                                               const std::vector<int64_t>& recv_counts) {
  check_tensor("all_to_all", output);
  check_tensor("all_to_all", input);
  MINIDL_CHECK(input.dtype() == output.dtype(), name(), " all_to_all: input is ", input.dtype(), ", output is ",
               output.dtype());
  MINIDL_CHECK(int(send_counts.size()) == size() && int(recv_counts.size()) == size(), name(),
               " all_to_all: expected a count per rank (", size(), "), got ", send_counts.size(), " send and ",
               recv_counts.size(), " receive counts");
  int64_t sent = 0, received = 0;
  for (int j = 0; j < size(); ++j) {
    MINIDL_CHECK(send_counts[size_t(j)] >= 0 && recv_counts[size_t(j)] >= 0, name(),
                 " all_to_all: counts must be >= 0, got ", send_counts[size_t(j)], " and ", recv_counts[size_t(j)],
                 " for rank ", j);
    sent += send_counts[size_t(j)], received += recv_counts[size_t(j)];
  }
  MINIDL_CHECK(sent == input.numel() && received == output.numel(), name(), " all_to_all: the send counts add up to ",
               sent, " and the receive counts to ", received, ", but input holds ", input.numel(), " and output holds ",
               output.numel(), " elements");
  MINIDL_CHECK(send_counts[size_t(rank())] == recv_counts[size_t(rank())], name(), " all_to_all: rank ", rank(),
               " sends itself ", send_counts[size_t(rank())], " elements but receives ", recv_counts[size_t(rank())]);
  // The fingerprint every rank shares (the counts differ between ranks): the dtype and the group's size.
  const Tensor fingerprint = Tensor::empty({size()}, input.dtype());
  return recorded("all_to_all", fingerprint, -1, nullptr, [&] {
    return do_all_to_all(output, overlaps(output, input) ? comm_copy(input, input.dtype()) : input, send_counts,
                         recv_counts);
  });
}

std::shared_ptr<Work> ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  check_tensor("send", tensor);
  MINIDL_CHECK(dst >= 0 && dst < size(), name(), " send: destination ", dst, " is not a rank of this group of ",
               size());
  MINIDL_CHECK(tag >= 0 && tag <= kMaxTag, name(), " send: tag must be in 0..", kMaxTag, ", got ", tag);
  if (tensor.numel() == 0) return completed_work();
  return recorded(
      "send", tensor, dst, nullptr, [&] { return do_send(tensor, dst, tag); }, tag);
}

std::shared_ptr<Work> ProcessGroup::recv(Tensor& tensor, int src, int tag) {
  check_tensor("recv", tensor);
  MINIDL_CHECK(src >= 0 && src < size(), name(), " recv: source ", src, " is not a rank of this group of ", size());
  MINIDL_CHECK(tag >= 0 && tag <= kMaxTag, name(), " recv: tag must be in 0..", kMaxTag, ", got ", tag);
  if (tensor.numel() == 0) return completed_work();
  return recorded(
      "recv", tensor, src, nullptr, [&] { return do_recv(tensor, src, tag); }, tag);
}

std::shared_ptr<Work> ProcessGroup::barrier() {
  return recorded("barrier", Tensor(), -1, nullptr, [&] { return do_barrier(); });
}

std::shared_ptr<Work> ProcessGroup::do_all_reduce(Tensor&, ReduceOp) { unsupported("all_reduce"); }
std::shared_ptr<Work> ProcessGroup::do_reduce_scatter(Tensor&, const Tensor&, ReduceOp) {
  unsupported("reduce_scatter");
}
std::shared_ptr<Work> ProcessGroup::do_all_gather(Tensor&, const Tensor&) { unsupported("all_gather"); }
std::shared_ptr<Work> ProcessGroup::do_broadcast(Tensor&, int) { unsupported("broadcast"); }
std::shared_ptr<Work> ProcessGroup::do_all_to_all(Tensor&, const Tensor&, const std::vector<int64_t>&,
                                                  const std::vector<int64_t>&) {
  unsupported("all_to_all");
}
std::shared_ptr<Work> ProcessGroup::do_send(const Tensor&, int, int) { unsupported("send"); }
std::shared_ptr<Work> ProcessGroup::do_recv(Tensor&, int, int) { unsupported("recv"); }
std::shared_ptr<Work> ProcessGroup::do_barrier() { unsupported("barrier"); }
std::shared_ptr<Work> ProcessGroup::do_all_reduce_16bit(Tensor&, ReduceOp) { unsupported("all_reduce_16bit"); }

namespace {

struct FactoryRegistry {
  std::mutex mutex;
  std::map<std::string, ProcessGroupFactory> factories;
};
FactoryRegistry& factory_registry() {
  static FactoryRegistry registry;
  return registry;
}

}  // namespace

void register_process_group_factory(const std::string& backend, ProcessGroupFactory factory) {
  FactoryRegistry& r = factory_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (factory)
    r.factories[backend] = factory;
  else
    r.factories.erase(backend);
}

namespace {

std::unique_ptr<ProcessGroup> make_backend(const std::string& backend, MPI_Comm comm, std::optional<Device> device) {
  if (backend == "mpi") {
    MINIDL_CHECK(!device || device->is_cpu(), "make_process_group: backend mpi serves CPU tensors, not ", *device,
                 " (use 'nccl' or 'ring' for device tensors)");
    return std::make_unique<MpiProcessGroup>(comm);
  }
  if (backend == "ring") return std::make_unique<RingProcessGroup>(comm, device.value_or(Device::cpu()));
  ProcessGroupFactory factory = nullptr;
  {
    FactoryRegistry& r = factory_registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (auto it = r.factories.find(backend); it != r.factories.end()) factory = it->second;
  }
  if (factory) return factory(comm, device);
  MINIDL_CHECK(backend != "nccl",
               "make_process_group: this build has no NCCL backend: link minidl_cuda_backend (built when CUDA and "
               "NCCL are found) and call minidl::cuda::register_backend() first");
  throw Error(::minidl::detail::concat("make_process_group: unknown backend '", backend,
                                       "'; expected 'mpi', 'ring' or 'nccl'"));
}

}  // namespace

std::unique_ptr<ProcessGroup> make_process_group(const std::string& backend, MPI_Comm comm,
                                                 std::optional<Device> device) {
  std::unique_ptr<ProcessGroup> group = make_backend(backend, comm, device);
  // The group's ranks in MPI_COMM_WORLD, which the watchdog names.
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MINIDL_MPI_CHECK(MPI_Comm_group(comm, &mine));
  MINIDL_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(size_t(group->size())), world_ranks(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) ranks[r] = int(r);
  MINIDL_MPI_CHECK(MPI_Group_translate_ranks(mine, int(ranks.size()), ranks.data(), world, world_ranks.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  group->set_world_ranks(std::move(world_ranks));
  group->watch_async_errors();
  if (checking_collectives()) {
    MPI_Comm check = MPI_COMM_NULL;
    MINIDL_MPI_CHECK(MPI_Comm_dup(comm, &check));
    group->set_check_channel(check);
  }
  return group;
}

}  // namespace minidl::dist
