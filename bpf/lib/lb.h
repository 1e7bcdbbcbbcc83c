/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Waggle's socket load balancer: the map layout shared by bpf/sock_lb.c and
 * the Go side (dataplane/ebpf, which generates its types from these structs
 * with bpf2go -type). bpf/README.md documents every byte; a change to any
 * struct or map here must bump WAGGLE_LB_LAYOUT_VERSION.
 */
#ifndef WAGGLE_LB_H
#define WAGGLE_LB_H

#include <linux/types.h>

/* Version of the map layout below, recorded in the meta map. */
#define WAGGLE_LB_LAYOUT_VERSION 3
/* "WGGL" as a little-endian u32. */
#define WAGGLE_LB_MAGIC 0x4c474757

/* Default map sizes; the loader overrides max_entries from its Config. */
#define LB_SERVICES_MAX 65536
#define LB_BACKENDS_MAX 65536
#define LB_REVNAT_MAX 65536
#define LB_REVERSE_SK_MAX 65536
#define LB_AFFINITY_MAX 65536

/*
 * A master entry of a service with at most LB_INLINE_BACKENDS backends holds
 * their IDs itself (lb_service.backends), and the service has no slot
 * entries: one map entry per service instead of 1 + count, and one lookup
 * fewer per connect. Larger services keep one slot entry per backend
 * (layout 2; layout 1 had slot entries only).
 */
#define LB_INLINE_BACKENDS 16

/* lb_service.flags */
#define SVC_FLAG_AFFINITY (1 << 0) /* sessionAffinity ClientIP */
#define SVC_FLAG_LOCAL (1 << 1)    /* traffic policy Local applied */

/*
 * Key of the services map. Addresses are IPv6 (16 bytes, network order);
 * an IPv4 address is stored IPv4-mapped (::ffff:a.b.c.d), so IPv4 sockets,
 * IPv6 sockets and dual-stack sockets connecting to ::ffff:a.b.c.d all find
 * the same entry. Slot 0 is the service's master entry; when count exceeds
 * LB_INLINE_BACKENDS, slots 1..count hold its backends.
 */
struct lb_service_key {
	__u8 addr[16];  /* frontend address */
	__be16 port;    /* frontend port, network order */
	__u16 slot;     /* 0: master entry; 1..count: backend slots */
	__u8 proto;     /* IPPROTO_TCP (6) or IPPROTO_UDP (17) */
	__u8 pad[3];
} __attribute__((aligned(8)));

/* Value of the services map. */
struct lb_service {
	__u32 backend_id;       /* slot > 0: the backend; master: 0 */
	__u16 count;            /* master: number of backend slots; slot: 0 */
	__u16 flags;            /* master: SVC_FLAG_*; slot: 0 */
	__u32 rev_nat_id;       /* the service's ID (key of the rev_nat map) */
	__u32 affinity_timeout; /* master: seconds of ClientIP affinity, 0 none */
	/* master with count <= LB_INLINE_BACKENDS: backends[i] is slot i+1's
	 * backend ID (written with the count in one update); else all 0. */
	__u32 backends[LB_INLINE_BACKENDS];
};

/*
 * Value of the backends map, an ARRAY indexed by backend ID (layout 3; a
 * hash map before). ID 0 is never used. An unused ID's entry has proto 0
 * (backend_free): the programs treat it as missing. IDs are reused, lowest
 * first; gen counts the backends an ID has held, so that an affinity entry
 * naming the ID matches only the backend it was written for (a stale entry
 * never follows a reused ID to another Service's backend).
 */
struct lb_backend {
	__u8 addr[16]; /* IPv6 or IPv4-mapped, network order */
	__be16 port;   /* network order */
	__u8 proto;    /* IPPROTO_TCP or IPPROTO_UDP; 0: the ID is unused */
	__u8 flags;    /* BACKEND_FLAG_* (user space only) */
	__u32 gen;     /* generation of the ID (never 0 for a used ID) */
};

/* backend_free: the entry of an unused backend ID. */
#define backend_free(be) ((be)->proto == 0)

/* Value of the rev_nat map (key: __u32 service ID): the frontend. */
struct lb_rev_nat {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad;
};

/*
 * Key of the reverse-socket LRU: which socket (by cookie) was sent to which
 * backend. recvmsg and getpeername use it to show the frontend instead.
 */
struct lb_reverse_sk_key {
	__u64 cookie;  /* bpf_get_socket_cookie() of the client socket */
	__u8 addr[16]; /* backend address */
	__be16 port;   /* backend port */
	__u8 pad[6];
} __attribute__((aligned(8)));

/* Value of the reverse-socket LRU. */
struct lb_reverse_sk {
	__u8 addr[16];   /* frontend address */
	__be16 port;     /* frontend port */
	__u16 pad;
	__u32 rev_nat_id; /* service ID, checked against rev_nat */
};

/*
 * Key of the affinity LRU. Socket hooks run before a source address is
 * chosen, so "ClientIP" affinity is keyed by the client's network namespace
 * (a pod), as Cilium's socket LB does.
 */
struct lb_affinity_key {
	__u64 netns_cookie; /* bpf_get_netns_cookie() of the client */
	__u32 rev_nat_id;   /* service ID */
	__u32 pad;
} __attribute__((aligned(8)));

/* Value of the affinity LRU. */
struct lb_affinity {
	__u64 last_used_ns; /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) of last use */
	__u32 backend_id;
	__u32 backend_gen;  /* lb_backend.gen when written: must still match */
};

/* The meta map's one entry: who wrote this pinned state. */
struct lb_meta {
	__u32 magic;          /* WAGGLE_LB_MAGIC */
	__u32 layout_version; /* WAGGLE_LB_LAYOUT_VERSION */
	__u64 created_unix;   /* when the maps were created, seconds */
};

/*
 * Value of the names map (key: __u32 service ID), written and read by user
 * space only: which Kubernetes Service port a frontend belongs to, for
 * `waggle bpf`. name is "namespace/name:port" (":port" only for named
 * ports), NUL-padded.
 */
struct lb_svc_name {
	__u8 kind;      /* 1 ClusterIP, 2 NodePort, 3 ExternalIP, 4 LoadBalancer */
	__u8 pad[3];
	char name[252];
};

/* Indexes of the per-CPU stats map. */
enum lb_stat {
	STAT_CONNECT_XLATE = 0,    /* connect rewritten to a backend */
	STAT_CONNECT_REFUSED = 1,  /* connect to a service without backends */
	STAT_SENDMSG_XLATE = 2,    /* unconnected UDP datagram rewritten */
	STAT_SENDMSG_REFUSED = 3,  /* datagram to a service without backends */
	STAT_RECVMSG_XLATE = 4,    /* reply source shown as the frontend */
	STAT_PEERNAME_XLATE = 5,   /* getpeername shown as the frontend */
	STAT_BIND_REFUSED = 6,     /* bind onto a frontend refused */
	STAT_AFFINITY_HIT = 7,     /* backend chosen from the affinity LRU */
	STAT_BACKEND_MISSING = 8,  /* slot or backend entry missing: refused */
	STAT_MAX = 9,
};

#endif /* WAGGLE_LB_H */
