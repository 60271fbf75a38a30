#pragma once
// Device tensors over a host communicator: each collective copies its device inputs to host
// staging buffers (Backend::to_host), runs the host collective on them and copies the results
// back (Backend::from_host). This is how ranks that share one GPU communicate (parallel.comm
// = "mpi" with a GPU backend): NCCL refuses two ranks of a group on one device. Host tensors
// (reduce_scalar's, checkpoint gathers) go to the host communicator as they are.
//
// It counts every call itself, with the elements and bytes the host communicator counts
// (communicator.h) and seconds that include the staging copies, so that CommPhase on it and
// a bench reading its stats see the whole cost. The host communicator's own counters are
// its private business.
#include <cstddef>
#include <memory>

#include "comm/communicator.h"
#include "backend/backend.h"

namespace bottle {

class StagedCommunicator final : public Communicator {
 public:
  // `backend` (which must outlive this) stages the device tensors.
  StagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  void all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  void all_gather(Tensor out, Tensor in, std::string_view site) override;
  void reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  void broadcast(Tensor x, int root, std::string_view site) override;
  void send(Tensor x, int dest, int tag, std::string_view site) override;
  void recv(Tensor x, int source, int tag, std::string_view site) override;
  void send_async(Tensor x, int dest, int tag, std::string_view site) override;
  void wait_sends() override;
  void barrier() override;
  // Splits the host communicator and stages the new group through the same backend.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  // The host group does the waiting.
  void set_timeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    host_->set_timeout(timeout);
  }

  Communicator& host() { return *host_; }

 private:
  // Host memory that only grows, so that a training run allocates once it has seen its
  // largest message.
  class Staging {
   public:
    // A host tensor with t's shape and dtype, over this buffer.
    Tensor like(const Tensor& t);

   private:
    std::unique_ptr<std::byte[]> bytes_;
    size_t capacity_ = 0;
  };

  // t itself when it lives on the host; else `staging` holding a copy of it (`copy` false:
  // an output whose old contents nobody reads).
  Tensor on_host(Tensor t, Staging& staging, bool copy);
  // Copies `host` back into t when t lives on the device (on_host gave a staging buffer).
  void back_to_device(Tensor t, Tensor host);

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
  Staging first_, second_;  // a collective's input and output
};

}  // namespace bottle
