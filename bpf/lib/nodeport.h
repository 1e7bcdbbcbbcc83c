/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * North-south load balancing (bpf/nodeport.c): the layout of its own maps,
 * shared with the Go side (dataplane/ebpf, bpf2go -type). The frontends and
 * backends are the socket load balancer's maps (lb.h); bpf/README.md
 * documents every byte. A change to a struct here bumps
 * WAGGLE_NP_LAYOUT_VERSION.
 */
#ifndef WAGGLE_NODEPORT_H
#define WAGGLE_NODEPORT_H

#include <linux/types.h>

#define WAGGLE_NP_LAYOUT_VERSION 4
/* "WGNP" as a little-endian u32. */
#define WAGGLE_NP_MAGIC 0x504e4757

#define NP_CT_MAX 131072
#define NP_AFFINITY_MAX 65536
#define NP_DEVICES_MAX 64
#define NP_SVC_MAX 65536
#define NP_MAGLEV_MAX 262144
#define NP_SRC_RANGES_MAX 65536
#define NP_FRAG_MAX 8192
/* Maglev tables are stored in chunks of this many entries. */
#define NP_MAGLEV_CHUNK 256

/* np_ct_key.dir */
#define NP_CT_ORIGINAL 0 /* client -> frontend, as it arrived */
#define NP_CT_REPLY 1    /* backend -> client or SNAT address, as it leaves the backend */
#define NP_CT_CLIENT 2   /* DNAT-only flows: any source -> client (src and sport zero), for
			  * replies whose source the node's own netfilter masqueraded (a CNI's
			  * masquerade of pod traffic leaving the pod network) */

/* np_ct.flags */
#define NP_CT_F_SNAT (1 << 0)    /* source rewritten to the node (remote backend) */
#define NP_CT_F_CLOSING (1 << 1) /* TCP FIN or RST seen */
#define NP_CT_F_REPLIED (1 << 2) /* the backend answered */
#define NP_CT_F_DSR (1 << 3)     /* direct server return: ORIGINAL on the entry node (DNAT only, the
				  * service address travels in an IP option); REPLY (and ORIGINAL,
				  * with NP_CT_F_DSR_RECV) on the backend's node, recorded from it */
#define NP_CT_F_DSR_RECV (1 << 4) /* ORIGINAL on the backend's node (client -> backend, as the
				   * client's packets arrive there): the other direction of a DSR
				   * flow it recorded, so the client's FIN/RST shortens it and a SYN
				   * without the option on the same tuple drops it */

/* waggle_np_lb_mode's value (--bpf-lb-mode): how new flows to a remote
 * backend are dispatched. */
#define NP_LB_MODE_SNAT 0   /* SNAT to the node's address: replies come back through it */
#define NP_LB_MODE_DSR 1    /* direct server return for TCP and UDP */
#define NP_LB_MODE_HYBRID 2 /* DSR for TCP, SNAT for UDP */

/* The DSR IPv4 option (Cilium's dsr-dispatch=opt wire format): type
 * 0x9a (copied, class 0, number 26), length 8, then the frontend's port
 * and address, network order. Inserted right after a 20-byte IPv4 header. */
#define NP_DSR_OPT4_TYPE 0x9a
#define NP_DSR_OPT4_LEN 8

/* The DSR IPv6 destination-options header (Cilium's wire format too),
 * inserted right after the IPv6 header: one option of type 0x1b (skip if
 * unknown, not changed en route), 20 bytes of data (the frontend's address
 * and port), two Pad1. 24 bytes: header length field 2. */
#define NP_DSR_OPT6_TYPE 0x1b
#define NP_DSR_OPT6_LEN 20
struct np_dsr_opt6 {
	__u8 nexthdr;
	__u8 hdrlen; /* 8-byte units beyond the first: 2 */
	__u8 type;   /* NP_DSR_OPT6_TYPE */
	__u8 len;    /* NP_DSR_OPT6_LEN */
	__u8 addr[16];
	__be16 port;
	__u8 pad[2]; /* Pad1, Pad1 */
} __attribute__((aligned(4))); /* addr read and written a word at a time */

/* np_device.flags */
#define NP_DEV_F_EXTERNAL (1 << 0) /* a north-south device: the programs are attached */
#define NP_DEV_F_XDP_NATIVE (1 << 1)  /* the ingress program also runs in driver XDP (user space only) */
#define NP_DEV_F_XDP_GENERIC (1 << 2) /* ... in generic XDP (user space only) */

/*
 * Key of the conntrack LRU. Addresses are IPv6 or IPv4-mapped, network
 * order, as in lb.h.
 */
struct np_ct_key {
	__u8 src[16];
	__u8 dst[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 dir; /* NP_CT_ORIGINAL or NP_CT_REPLY */
	__u8 pad[2];
};

/*
 * Value of the conntrack LRU.
 *   ORIGINAL: addr/port = the backend, nat/nat_port = the SNAT source (when
 *             NP_CT_F_SNAT), backend_id = the backend chosen.
 *   REPLY:    addr/port = the client (restored as destination),
 *             nat/nat_port = the frontend (restored as source).
 */
struct np_ct {
	__u64 expires_ns; /* bpf_ktime_get_ns() after which the entry is dead */
	__u64 created_ns;
	__u8 addr[16];
	__u8 nat[16];
	__be16 port;
	__be16 nat_port;
	__u32 backend_id;
	__u32 rev_nat_id; /* the frontend's service ID */
	__u8 flags;       /* NP_CT_F_* */
	__u8 pad[3];
	__u64 packets; /* packets seen in this entry's direction */
};

/* Key of the ClientIP affinity LRU: the client's address, not a netns. */
struct np_affinity_key {
	__u8 client[16];
	__u32 rev_nat_id;
	__u32 pad;
};

struct np_affinity {
	__u64 last_used_ns;
	__u32 backend_id;
	__u32 backend_gen; /* lb_backend.gen when written: must still match
			    * (socket-LB layout 3; padding, 0, before) */
};

/* Value of the north-south services map (key: __u32 service ID, the
 * frontend's lb_service.rev_nat_id): only NodePort, ExternalIP and
 * LoadBalancer frontends have one. */
struct np_svc {
	__u32 table; /* Maglev table ID (0: none, the frontend has no backends) */
	__u32 flags; /* NP_SVC_F_* (was zero padding in the first layout: no flags) */
};

/* np_svc.flags */
#define NP_SVC_F_SRC_RANGES (1 << 0) /* loadBalancerSourceRanges: new flows only from waggle_np_src_ranges */

/*
 * Key of the loadBalancerSourceRanges LPM trie: the frontend's service ID,
 * then the client address (IPv6 or IPv4-mapped). prefixlen counts the ID's
 * 32 bits too: an IPv4 /n is 32 + 96 + n.
 */
struct np_src_range_key {
	__u32 prefixlen;
	__u32 rev_nat_id; /* network order (big-endian), so the trie's bit order matches */
	__u8 addr[16];
};

/* Key of the Maglev map: chunk c of table t holds entries c*256 .. c*256+255. */
struct np_maglev_key {
	__u32 table;
	__u32 chunk;
};

/* Value of the Maglev map: backend IDs (0: empty). */
struct np_maglev_chunk {
	__u32 backend[NP_MAGLEV_CHUNK];
};

/* Value of the devices map (key: __u32 ifindex). Layout 2 appended addr6
 * (8 bytes in layout 1), layout 3 mac (24 bytes in layout 2). */
struct np_device {
	__be32 addr4;    /* the IPv4 SNAT source for traffic leaving this device (0: none) */
	__u32 flags;     /* NP_DEV_F_* */
	__u8 addr6[16];  /* the IPv6 SNAT source (all zero: none) */
	__u8 mac[6];     /* the device's MAC: XDP serves only unicast frames to it (all zero: any) */
	__u8 pad[2];
};

/*
 * Key of the fragment LRU: a fragmented IP datagram as it arrived (before
 * any translation), by its addresses (IPv6 or IPv4-mapped), IP ID (IPv4's
 * 16 bits, network order, in the low-addressed bytes; IPv6: the fragment
 * header's 32-bit identification) and L4 protocol.
 */
struct np_frag_key {
	__u8 src[16];
	__u8 dst[16];
	__u32 id;
	__u8 proto;
	__u8 pad[3];
};

/* Value of the fragment LRU: the first fragment's L4 ports, which the
 * datagram's later fragments do not carry. */
struct np_frag {
	__be16 sport;
	__be16 dport;
};

/* The config map's one entry. */
struct np_config {
	__u32 magic;          /* WAGGLE_NP_MAGIC */
	__u32 layout_version; /* WAGGLE_NP_LAYOUT_VERSION */
	__u32 maglev_size;    /* entries of every Maglev table (a prime) */
	__u16 snat_min;       /* SNAT source ports, host order, inclusive */
	__u16 snat_max;
};

enum np_stat {
	NP_STAT_XLATE_LOCAL = 0,   /* new flow to a backend on this node (DNAT only) */
	NP_STAT_XLATE_SNAT = 1,    /* new flow to a remote backend (DNAT + SNAT) */
	NP_STAT_CT_HIT = 2,        /* packet of an established flow */
	NP_STAT_REPLY = 3,         /* reply translated back to the frontend */
	NP_STAT_NO_BACKEND = 4,    /* frontend without backends: left to the stack (a reject) */
	NP_STAT_LOCAL_DROP = 5,    /* externalTrafficPolicy Local, no local backend: dropped */
	NP_STAT_FRAGMENT = 6,      /* fragment not translated (its first fragment was not, or not yet): left to the stack */
	NP_STAT_SNAT_EXHAUSTED = 7, /* no free SNAT port: dropped */
	NP_STAT_FIB_MISS = 8,      /* no route to the backend: left to the stack */
	NP_STAT_MAGLEV_MISS = 9,   /* Maglev slot empty: fell back to the slot hash */
	NP_STAT_AFFINITY_HIT = 10, /* backend from the ClientIP affinity LRU */
	NP_STAT_BACKEND_GONE = 11, /* established flow's backend removed: chose again */
	NP_STAT_SRC_RANGE_DROP = 12, /* new flow from outside loadBalancerSourceRanges: dropped */
	NP_STAT_ICMP_ERROR = 13,     /* ICMP error about a SNATed flow translated back to the client */
	NP_STAT_XDP_FWD = 14,          /* packets translated and forwarded in XDP (XDP_TX, XDP_REDIRECT) */
	NP_STAT_XDP_PARTIAL_CSUM = 15, /* left to tc by XDP: the L4 checksum was left to offload */
	NP_STAT_IPV6_EXTHDR = 16,      /* IPv6 with an extension header not skipped (routing, AH, ESP, ...): left to the stack */
	NP_STAT_OTHER_HOST = 17,       /* unicast frame to another machine's MAC (a switch's flood): left to the stack */
	NP_STAT_FRAG_XLATE = 18,       /* non-first fragment translated with its first fragment's ports (waggle_np_frag) */
	NP_STAT_XLATE_DSR = 19,        /* new flow to a remote backend dispatched DSR (entry node) */
	NP_STAT_DSR_OPT = 20,          /* packets sent with the DSR option (entry node: TCP SYNs, UDP) */
	NP_STAT_DSR_RECV = 21,         /* DSR option read, flow recorded, option stripped (backend's node) */
	NP_STAT_DSR_MTU = 22,          /* no room for the DSR option: a new flow SNATed, or a packet sent without it */
	NP_STAT_MAX = 23,
};

#endif /* WAGGLE_NODEPORT_H */
