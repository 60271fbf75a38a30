/* tools/cluster/delayswitch.c: the learning Ethernet switch of the cluster harness
 * (tools/cluster/cluster.sh) for kernels without sch_netem. It runs in the run's switch
 * namespace in place of the bridge, reads every frame that enters a port (the switch-side
 * end of a rank's veth pair) through an AF_PACKET socket, and sends it out of the port that
 * owns the destination MAC address after a fixed one-way delay: INTRA_NS between two ports
 * of the same emulated node, INTER_NS between ports of different nodes. Broadcasts (ARP)
 * and unknown destinations are flooded, each copy with the delay of its pair of ports.
 *
 *   delayswitch INTRA_NS INTER_NS IFNAME:NODE [IFNAME:NODE ...]
 *
 * Frames keep their GSO/checksum metadata (PACKET_VNET_HDR), so TCP's 64 KiB segments cross
 * whole. With one delay per tier each tier's queue is in release order, so two FIFO lists
 * suffice; at most 256 MiB waits at once (a frame beyond that is dropped, like a switch with
 * a full buffer). The process asks for SCHED_FIFO (falls back to its nice value) so that
 * ranks spinning in MPI calls on a 2-core machine do not delay its wake-ups; it sleeps in
 * ppoll until the next frame is due with a 1 ns timer slack. It prints one line ending in
 * "ready" once every port is open (cluster.sh up waits for it); SIGTERM ends it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

enum { max_ports = 1024, max_frame = 256 * 1024 + sizeof(struct virtio_net_hdr) };
static const size_t max_queued_bytes = 256u << 20;

struct frame {
  struct frame* next;
  uint64_t due;
  int port;
  size_t len;
  unsigned char data[];
};
struct queue {
  struct frame *head, *tail;
};

static struct pollfd fds[max_ports];
static int node_of[max_ports];
static int ports;
static unsigned char macs[max_ports][6]; /* learned: the MAC address seen behind each port */
static int mac_known[max_ports];
static struct queue tiers[2]; /* 0: intra-node, 1: inter-node */
static uint64_t delay_ns[2];
static size_t queued_bytes;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void die(const char* what) {
  fprintf(stderr, "delayswitch: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int open_port(const char* name) {
  const int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (fd < 0) die("socket");
  const int one = 1, buffer = 8 << 20;
  if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) die("PACKET_VNET_HDR");
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one) < 0)
    die("PACKET_IGNORE_OUTGOING");
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer);
  struct sockaddr_ll address = {0};
  address.sll_family = AF_PACKET;
  address.sll_protocol = htons(ETH_P_ALL);
  address.sll_ifindex = (int)if_nametoindex(name);
  if (address.sll_ifindex == 0) die(name);
  if (bind(fd, (struct sockaddr*)&address, sizeof address) < 0) die("bind");
  return fd;
}

/* Queues a copy of the frame for `port`, due after the delay between `from` and `port`. */
static void enqueue(int from, int port, const unsigned char* data, size_t len, uint64_t now) {
  if (queued_bytes + len > max_queued_bytes) return;
  struct frame* f = malloc(sizeof *f + len);
  if (!f) return;
  const int tier = node_of[from] == node_of[port] ? 0 : 1;
  f->next = NULL;
  f->due = now + delay_ns[tier];
  f->port = port;
  f->len = len;
  memcpy(f->data, data, len);
  queued_bytes += len;
  struct queue* q = &tiers[tier];
  if (q->tail) q->tail->next = f; else q->head = f;
  q->tail = f;
}

static void forward(int from, const unsigned char* data, size_t len, uint64_t now) {
  if (len < sizeof(struct virtio_net_hdr) + 14) return;
  const unsigned char* ethernet = data + sizeof(struct virtio_net_hdr);
  const unsigned char* destination = ethernet;
  const unsigned char* source = ethernet + 6;
  if (!(source[0] & 1)) {
    memcpy(macs[from], source, 6);
    mac_known[from] = 1;
  }
  if (!(destination[0] & 1)) {
    for (int p = 0; p < ports; ++p) {
      if (mac_known[p] && memcmp(macs[p], destination, 6) == 0) {
        if (p != from) enqueue(from, p, data, len, now);
        return;
      }
    }
  }
  for (int p = 0; p < ports; ++p) /* broadcast, multicast or not yet learned: flood */
    if (p != from) enqueue(from, p, data, len, now);
}

static void release(uint64_t now) {
  for (int t = 0; t < 2; ++t) {
    struct queue* q = &tiers[t];
    while (q->head && q->head->due <= now) {
      struct frame* f = q->head;
      q->head = f->next;
      if (!q->head) q->tail = NULL;
      /* A port that is down (cluster.sh cut) or full drops the frame, as a wire would. */
      (void)!send(fds[f->port].fd, f->data, f->len, MSG_DONTWAIT);
      queued_bytes -= f->len;
      free(f);
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: delayswitch INTRA_NS INTER_NS IFNAME:NODE [IFNAME:NODE ...]\n");
    return 2;
  }
  delay_ns[0] = strtoull(argv[1], NULL, 10);
  delay_ns[1] = strtoull(argv[2], NULL, 10);
  for (int i = 3; i < argc && ports < max_ports; ++i, ++ports) {
    char name[IF_NAMESIZE];
    const char* colon = strrchr(argv[i], ':');
    if (!colon || colon == argv[i] || colon - argv[i] >= IF_NAMESIZE) {
      fprintf(stderr, "delayswitch: %s is not IFNAME:NODE\n", argv[i]);
      return 2;
    }
    memcpy(name, argv[i], (size_t)(colon - argv[i]));
    name[colon - argv[i]] = '\0';
    node_of[ports] = atoi(colon + 1);
    fds[ports].fd = open_port(name);
    fds[ports].events = POLLIN;
  }
  struct sched_param priority = {.sched_priority = 10};
  if (sched_setscheduler(0, SCHED_FIFO, &priority) < 0 && nice(-10) == -1) {
    /* Neither is allowed here: run at the ordinary priority. */
  }
  prctl(PR_SET_TIMERSLACK, 1UL);
  printf("delayswitch: %d ports, delays %llu ns intra-node, %llu ns inter-node: ready\n", ports,
         (unsigned long long)delay_ns[0], (unsigned long long)delay_ns[1]);
  fflush(stdout);
  static unsigned char buffer[max_frame];
  for (;;) {
    uint64_t now = now_ns();
    release(now);
    uint64_t next = UINT64_MAX;
    for (int t = 0; t < 2; ++t)
      if (tiers[t].head && tiers[t].head->due < next) next = tiers[t].head->due;
    struct timespec wait, *timeout = NULL;
    if (next != UINT64_MAX) {
      const uint64_t left = next > now ? next - now : 0;
      wait.tv_sec = (time_t)(left / 1000000000u);
      wait.tv_nsec = (long)(left % 1000000000u);
      timeout = &wait;
    }
    const int ready = ppoll(fds, (nfds_t)ports, timeout, NULL);
    if (ready < 0 && errno != EINTR) die("ppoll");
    if (ready <= 0) continue;
    now = now_ns();
    for (int p = 0; p < ports; ++p) {
      /* POLLERR: the port went down (cluster.sh cut); recv reports and clears the error. */
      if (!(fds[p].revents & (POLLIN | POLLERR))) continue;
      for (int n = 0; n < 64; ++n) { /* a bounded batch per port, then the others' turn */
        const ssize_t got = recv(fds[p].fd, buffer, sizeof buffer, MSG_TRUNC | MSG_DONTWAIT);
        if (got < 0) break;
        if ((size_t)got <= sizeof buffer) forward(p, buffer, (size_t)got, now);
      }
    }
  }
}
