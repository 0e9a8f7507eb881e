// The ring collectives.
//
// ---- How the ring all-reduce works, and why it is bandwidth-optimal ----
//
// n ranks each hold a buffer of S bytes; every rank wants the element-wise sum. Cut the buffer into n chunks of
// S/n bytes and arrange the ranks in a ring: rank r only ever sends to r+1 and receives from r-1 (mod n).
//
// Phase 1, reduce-scatter (n-1 steps). At step s rank r sends chunk (r-s-1) to the right and receives chunk
// (r-s-2) from the left, adding it into its own copy. The chunk a rank sends at step s+1 is the one it has just
// added into, so every chunk walks around the ring collecting one rank's contribution per hop. After n-1 hops
// chunk c has visited all ranks and lies, complete, on rank c. With n = 3 (chunks a, b, c; "+" = summed so far):
//
//            rank 0          rank 1          rank 2
//   start    a0 b0 c0        a1 b1 c1        a2 b2 c2
//   step 0   sends c0 -> 1   sends a1 -> 2   sends b2 -> 0
//            b0+b2           c1+c0           a2+a1
//   step 1   sends b0+b2     sends c1+c0     sends a2+a1
//            a0+a2+a1 = A    b1+b0+b2 = B    c2+c1+c0 = C
//
// Phase 2, all-gather (n-1 steps). At step t rank r sends chunk (r-t) (at t = 0 its own finished chunk) and
// receives chunk (r-t-1), overwriting its copy; again what it forwards next is what it has just received.
//
// Cost. In every one of the 2(n-1) steps each rank sends one chunk and receives one chunk of S/n bytes, and all
// n links work at the same time. So each rank sends (and receives)
//
//       2(n-1)/n · S  bytes,   time  T = 2(n-1)·α + 2(n-1)/n · S·β
//
// with α the latency of one message and β the time per byte of a rank's link. The bandwidth term tends to 2·S·β
// and does not grow with n: adding ranks does not slow the ring down. It cannot be beaten either: to own the sum
// of its 1/n of the buffer a rank must receive the other ranks' (n-1)/n · S bytes of contributions, and then
// receive the (n-1)/n · S bytes of results it did not compute. That is why nccl-tests reports
// busbw = algbw · 2(n-1)/n: for a bandwidth-optimal all-reduce it is the link speed, whatever n is.
// The latency term 2(n-1)·α does grow with n, which is why small messages are better served by trees or
// recursive doubling (MPI picks those for them); the ring is for the megabyte buckets of DDP.
//
// Pipelining. Moving whole chunks would make each step wait for a full chunk before forwarding it, and leave
// the link idle while a rank adds. So each chunk moves as slices of RingOptions::slice_bytes: slice j of step k+1
// is sent as soon as slice j of step k has arrived and been reduced, the receives of a step are posted together,
// and adding slice j overlaps with slices j+1, j+2, ... arriving. A large message streams through the ring.
//
// Uneven sizes. shard_range() cuts numel elements into n chunks differing by at most one element; with
// numel < n some chunks are empty and their slices are simply never sent. Both ends of every message compute
// its size from the same function, so no sizes are exchanged.
#include "dist/ring_backend.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "core/memory.h"
#include "dist/reduce.h"

namespace minidl::dist {

namespace {

// The collectives' own messages use tag 0; user send/recv tags are shifted up by one so they never match them.
constexpr int kRingTag = 0;
constexpr int kUserTagBase = 1;

int mod(int a, int n) { return ((a % n) + n) % n; }

// A send or recv started on a transport; holds the tensor so its memory outlives the transfer.
class TransportWork final : public Work {
 public:
  TransportWork(RingTransport* transport, RingTransport::Ticket ticket, Tensor tensor)
      : transport_(transport), ticket_(ticket), tensor_(std::move(tensor)) {}
  ~TransportWork() override {
    if (!done_) transport_->wait(ticket_);  // never leave the transport writing into freed memory
  }
  void wait() override {
    if (!done_) transport_->wait(ticket_);
    done_ = true;
  }
  bool is_completed() override { return done_ || (done_ = transport_->test(ticket_)); }

 private:
  RingTransport* transport_;
  RingTransport::Ticket ticket_;
  Tensor tensor_;
  bool done_ = false;
};

}  // namespace

namespace {

// ---- ring schedules ----

// One step of a ring schedule: receive chunk `recv_chunk` from the left neighbour and add it into this rank's
// copy (reduce) or overwrite the copy with it (gather); meanwhile send the right neighbour the chunk received in
// the previous step (at step 0, the schedule's first_send_chunk).
struct RingStep {
  int recv_chunk;
  bool reduce;
};

struct RingSchedule {
  int first_send_chunk;
  std::vector<RingStep> steps;
};

// Leaves chunk r, reduced over all ranks, on rank r.
RingSchedule reduce_scatter_schedule(int rank, int n) {
  RingSchedule schedule{mod(rank - 1, n), {}};
  for (int s = 0; s < n - 1; ++s) schedule.steps.push_back({mod(rank - s - 2, n), true});
  return schedule;
}

// Starts from chunk r on rank r, ends with every chunk everywhere.
RingSchedule all_gather_schedule(int rank, int n) {
  RingSchedule schedule{rank, {}};
  for (int t = 0; t < n - 1; ++t) schedule.steps.push_back({mod(rank - t - 1, n), false});
  return schedule;
}

// Reduce-scatter then all-gather. The last chunk the first phase completes (r) is the first one the second phase
// sends, so the phases stream into each other without a pause.
RingSchedule all_reduce_schedule(int rank, int n) {
  RingSchedule schedule = reduce_scatter_schedule(rank, n);
  for (const RingStep& step : all_gather_schedule(rank, n).steps) schedule.steps.push_back(step);
  return schedule;
}

// Elements [range.begin, range.end) of a contiguous tensor, viewed flat.
Tensor elements(const Tensor& t, ShardRange range) { return t.as_strided({range.size()}, {1}, range.begin); }

// Runs `schedule` on `buffer` (contiguous, viewed flat and cut into n chunks), pipelined by slices. The same code
// serves CUDA tensors: there the transport is NCCL's, waiting for a receive orders the device's compute stream
// after it, and reduce_into/divide_by (dist/reduce.h) queue their kernels on that stream.
//
// Buffer safety: a receive may only land on bytes no send is still reading. Receives of step k go into the
// chunk of step k (gather) or into `scratch` (reduce), so before posting them every send of steps < k is waited
// for: with n = 2 the chunk a rank sends at step 0 is the chunk it receives at the last step. Sends of step k
// itself read the previous step's chunk, never the one being received.
void run_ring(RingTransport& transport, const RingOptions& options, Tensor& buffer, const RingSchedule& schedule,
              ReduceOp op) {
  using Ticket = RingTransport::Ticket;
  const int n = transport.size(), right = mod(transport.rank() + 1, n), left = mod(transport.rank() - 1, n);
  const DType dtype = buffer.dtype();
  const int64_t elem = int64_t(dtype_size(dtype)), numel = buffer.numel();
  const int64_t slice_elems = std::max<int64_t>(1, options.slice_bytes / elem);

  auto num_slices = [&](int chunk) { return (shard_range(numel, n, chunk).size() + slice_elems - 1) / slice_elems; };
  auto slice = [&](int chunk, int64_t j) {
    ShardRange c = shard_range(numel, n, chunk);
    return ShardRange{c.begin + j * slice_elems, std::min(c.end, c.begin + (j + 1) * slice_elems)};
  };
  auto send_slice = [&](int chunk, int64_t j) {
    ShardRange s = slice(chunk, j);
    return transport.start_send(buffer, s.begin * elem, s.size() * elem, right, kRingTag);
  };

  if (schedule.steps.empty()) return;  // a world of one: nothing to exchange

  // Reduce steps receive into scratch (as large as the largest chunk, chunk 0) and add from there.
  Tensor scratch;
  if (schedule.steps.front().reduce) {
    MemoryTagGuard tag(MemTag::kComm);
    scratch = Tensor::empty({shard_range(numel, n, 0).size()}, dtype, buffer.device());
  }

  std::vector<Ticket> older_sends, sends, next_sends, recvs;  // sends = those feeding the current step
  for (int64_t j = 0; j < num_slices(schedule.first_send_chunk); ++j)
    sends.push_back(send_slice(schedule.first_send_chunk, j));

  for (size_t k = 0; k < schedule.steps.size(); ++k) {
    const RingStep& step = schedule.steps[k];
    const ShardRange chunk = shard_range(numel, n, step.recv_chunk);
    const bool has_next = k + 1 < schedule.steps.size();
    // This step completes its chunk's reduction when the next step only gathers (or there is none).
    const bool completes_reduction = step.reduce && (!has_next || !schedule.steps[k + 1].reduce);

    for (Ticket t : older_sends) transport.wait(t);
    older_sends.clear();

    recvs.clear();
    for (int64_t j = 0; j < num_slices(step.recv_chunk); ++j) {
      ShardRange s = slice(step.recv_chunk, j);
      if (step.reduce)
        recvs.push_back(transport.start_recv(scratch, (s.begin - chunk.begin) * elem, s.size() * elem, left, kRingTag));
      else
        recvs.push_back(transport.start_recv(buffer, s.begin * elem, s.size() * elem, left, kRingTag));
    }

    for (int64_t j = 0; j < int64_t(recvs.size()); ++j) {
      transport.wait(recvs[j]);
      ShardRange s = slice(step.recv_chunk, j);
      if (step.reduce) {
        Tensor mine = elements(buffer, s);
        reduce_into(mine, elements(scratch, {s.begin - chunk.begin, s.end - chunk.begin}), op);
        // kAvg divides once, by the finished slice's owner, before it is sent on: n times fewer divisions than
        // dividing the whole buffer at the end, and the same quotients.
        if (completes_reduction && op == ReduceOp::kAvg) divide_by(mine, n);
      }
      if (has_next) next_sends.push_back(send_slice(step.recv_chunk, j));  // forward it at once: the pipeline
    }

    older_sends = std::move(sends);
    sends = std::move(next_sends);
    next_sends.clear();
  }
  for (Ticket t : older_sends) transport.wait(t);
  for (Ticket t : sends) transport.wait(t);
}

}  // namespace

RingProcessGroup::RingProcessGroup(MPI_Comm comm, RingOptions options)
    : RingProcessGroup(std::make_unique<MpiRingTransport>(comm), options) {}

RingProcessGroup::RingProcessGroup(MPI_Comm comm, Device device, RingOptions options)
    : RingProcessGroup(make_ring_transport(comm, device), options) {}

RingProcessGroup::RingProcessGroup(std::unique_ptr<RingTransport> transport, RingOptions options)
    : transport_(std::move(transport)), options_(options) {
  MINIDL_CHECK(options_.slice_bytes > 0, "RingProcessGroup: slice_bytes must be positive, got ", options_.slice_bytes);
}

std::shared_ptr<Work> RingProcessGroup::do_all_reduce(Tensor& tensor, ReduceOp op) {
  run_ring(*transport_, options_, tensor, all_reduce_schedule(rank(), size()), op);
  return completed_work();
}

std::shared_ptr<Work> RingProcessGroup::do_all_reduce_16bit(Tensor& tensor, ReduceOp op) {
  MINIDL_CHECK(tensor.device().is_cpu(), "ring all_reduce_16bit: on the CPU only (on a device, use nccl)");
  run_ring(*transport_, options_, tensor, all_reduce_schedule(rank(), size()), op);  // each hop rounds its sum
  return completed_work();
}

std::shared_ptr<Work> RingProcessGroup::do_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) {
  // The ring reduces in place, and the input is const: work on a copy (one copy of S bytes, cheap next to
  // the (n-1)/n · S bytes the ring moves, and it keeps the schedule the same as all-reduce's first phase).
  Tensor work;
  {
    MemoryTagGuard tag(MemTag::kComm);
    work = Tensor::empty({input.numel()}, input.dtype(), input.device());
  }
  work.copy_(elements(input, {0, input.numel()}));
  run_ring(*transport_, options_, work, reduce_scatter_schedule(rank(), size()), op);
  elements(output, {0, output.numel()}).copy_(elements(work, shard_range(work.numel(), size(), rank())));
  return completed_work();
}

std::shared_ptr<Work> RingProcessGroup::do_all_gather(Tensor& output, const Tensor& input) {
  elements(output, shard_range(output.numel(), size(), rank())).copy_(elements(input, {0, input.numel()}));
  run_ring(*transport_, options_, output, all_gather_schedule(rank(), size()), ReduceOp::kSum);
  return completed_work();
}

// Pairwise exchange: in round k = 1 .. n-1 rank r sends its part for r+k and receives the part of r-k, so every
// pair meets once and no rank waits for a third. Each round's receive is started before its send; a zero count
// sends nothing (the peer, whose receive count is that number, expects nothing).
std::shared_ptr<Work> RingProcessGroup::do_all_to_all(Tensor& output, const Tensor& input,
                                                      const std::vector<int64_t>& send_counts,
                                                      const std::vector<int64_t>& recv_counts) {
  const int n = size(), me = rank();
  const int64_t elem = int64_t(dtype_size(input.dtype()));
  std::vector<int64_t> send_at(size_t(n) + 1, 0), recv_at(size_t(n) + 1, 0);
  for (int j = 0; j < n; ++j) {
    send_at[size_t(j) + 1] = send_at[size_t(j)] + send_counts[size_t(j)];
    recv_at[size_t(j) + 1] = recv_at[size_t(j)] + recv_counts[size_t(j)];
  }
  if (send_counts[size_t(me)] > 0)
    elements(output, {recv_at[size_t(me)], recv_at[size_t(me) + 1]})
        .copy_(elements(input, {send_at[size_t(me)], send_at[size_t(me) + 1]}));
  for (int k = 1; k < n; ++k) {
    const int to = mod(me + k, n), from = mod(me - k, n);
    std::optional<RingTransport::Ticket> recv, send;
    if (recv_counts[size_t(from)] > 0)
      recv = transport_->start_recv(output, recv_at[size_t(from)] * elem, recv_counts[size_t(from)] * elem, from,
                                    kRingTag);
    if (send_counts[size_t(to)] > 0)
      send = transport_->start_send(input, send_at[size_t(to)] * elem, send_counts[size_t(to)] * elem, to, kRingTag);
    if (recv) transport_->wait(*recv);
    if (send) transport_->wait(*send);
  }
  return completed_work();
}

// Broadcast along the ring: root -> root+1 -> ... -> root-1. Each rank forwards a slice as soon as it has it, so
// the time is about (S + (n-2)·slice)·β rather than (n-1)·S·β.
std::shared_ptr<Work> RingProcessGroup::do_broadcast(Tensor& tensor, int root) {
  const int n = size();
  const int position = mod(rank() - root, n);  // hops from the root
  const int64_t elem = int64_t(dtype_size(tensor.dtype()));
  const int64_t slice_elems = std::max<int64_t>(1, options_.slice_bytes / elem);
  const int64_t slices = (tensor.numel() + slice_elems - 1) / slice_elems;
  auto bytes_of = [&](int64_t j) { return (std::min(tensor.numel(), (j + 1) * slice_elems) - j * slice_elems) * elem; };

  std::vector<RingTransport::Ticket> recvs, sends;
  if (position > 0)
    for (int64_t j = 0; j < slices; ++j)
      recvs.push_back(
          transport_->start_recv(tensor, j * slice_elems * elem, bytes_of(j), mod(rank() - 1, n), kRingTag));
  for (int64_t j = 0; j < slices; ++j) {
    if (position > 0) transport_->wait(recvs[j]);
    if (position < n - 1)
      sends.push_back(
          transport_->start_send(tensor, j * slice_elems * elem, bytes_of(j), mod(rank() + 1, n), kRingTag));
  }
  for (auto t : sends) transport_->wait(t);
  return completed_work();
}

std::shared_ptr<Work> RingProcessGroup::do_send(const Tensor& tensor, int dst, int tag) {
  auto ticket = transport_->start_send(tensor, 0, int64_t(tensor.nbytes()), dst, kUserTagBase + tag);
  return std::make_shared<TransportWork>(transport_.get(), ticket, tensor);
}

std::shared_ptr<Work> RingProcessGroup::do_recv(Tensor& tensor, int src, int tag) {
  auto ticket = transport_->start_recv(tensor, 0, int64_t(tensor.nbytes()), src, kUserTagBase + tag);
  return std::make_shared<TransportWork>(transport_.get(), ticket, tensor);
}

// A ring all-reduce of one integer: no rank can finish it before every rank has contributed. On a device the
// host then waits for the device to get there, so that the barrier holds for the host too.
std::shared_ptr<Work> RingProcessGroup::do_barrier() {
  Tensor token = Tensor::zeros({1}, DType::i32, device());
  run_ring(*transport_, options_, token, all_reduce_schedule(rank(), size()), ReduceOp::kSum);
  if (!device().is_cpu()) device_backend(device(), "barrier").synchronize(device().index);
  return completed_work();
}

}  // namespace minidl::dist
