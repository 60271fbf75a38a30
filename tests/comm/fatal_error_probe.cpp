// Run by test_fatal_error under mpirun: `fatal_error_probe MODE` where MODE is
//   clean     every rank meets at a barrier and exits 0;
//   one       rank 1 reports a fatal error while the others wait at a barrier for it;
//   all       every rank reports the same fatal error (a bad config).
#include <cstdio>
#include <string>

#include "comm/communicator.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  bottle::Communicator& world = bottle::world_communicator();
  if (mode == "clean") {
    world.barrier();
    return 0;
  }
  if (mode == "one") {
    if (world.rank() == 1) {
      bottle::report_fatal_error("error", "probe failure on one rank");
      return 1;
    }
    world.barrier();
    return 0;
  }
  if (mode == "all") {
    bottle::report_fatal_error("error", "probe failure on every rank");
    return 1;
  }
  std::fprintf(stderr, "usage: fatal_error_probe clean|one|all\n");
  return 2;
}
