/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * NetworkPolicy enforcement: key/value layouts shared by bpf/policy.c and
 * dataplane/policy (bpf2go -type). bpf/README.md documents every field.
 * Addresses are IPv6 or IPv4-mapped IPv6, network order; ports network
 * order; every other integer host order.
 */
#ifndef WAGGLE_POLICY_H
#define WAGGLE_POLICY_H

#include <linux/types.h>

#define WAGGLE_POL_LAYOUT_VERSION 1
#define WAGGLE_POL_MAGIC 0x4c4f5057 /* "WPOL" */

/* Directions, as the pod sees them. */
#define POL_DIR_INGRESS 0 /* to the pod: tcx egress of its host-side veth */
#define POL_DIR_EGRESS 1  /* from the pod: tcx ingress of its host-side veth */

/* Reserved identities. Label-set identities start at POL_ID_FIRST_LABEL,
 * ipBlock (CIDR) identities at POL_ID_FIRST_CIDR. */
#define POL_ID_ANY 0   /* in a policy key: any peer */
#define POL_ID_HOST 1  /* this node's own addresses */
#define POL_ID_WORLD 2 /* no pod, no ipBlock prefix */
#define POL_ID_FIRST_LABEL 256
#define POL_ID_FIRST_CIDR 0x01000000

/* pol_endpoint.flags */
#define POL_EP_INGRESS_ISOLATED (1 << 0)
#define POL_EP_EGRESS_ISOLATED (1 << 1)

/* Verdicts and reasons (pol_event, counters). */
#define POL_VERDICT_ALLOW 0
#define POL_VERDICT_DROP 1

#define POL_REASON_POLICY 0      /* a policy entry allowed it */
#define POL_REASON_NOT_ISOLATED 1 /* no policy isolates the pod this way */
#define POL_REASON_HOST 2        /* the pod's own node, either way */
#define POL_REASON_CT 3          /* established (or reply), revision current */
#define POL_REASON_DEFAULT_DENY 4 /* isolated, nothing allows it */
#define POL_REASON_CT_REVOKED 5  /* established, but the new policy denies it */

/* pol_config.monitor bits */
#define POL_MON_DROPS (1 << 0)
#define POL_MON_ALLOWS (1 << 1)

/* waggle_pol_endpoints: key __u32 ifindex of the pod's host-side veth. */
struct pol_endpoint {
	__u32 flags;
	__u32 rev;      /* bumped whenever the endpoint's policy changes */
	__u32 identity; /* the pod's own label-set identity */
	__u32 pad;
	__u64 allowed[2]; /* new flows allowed, by direction */
	__u64 denied[2];  /* packets dropped, by direction */
};

/* waggle_pol_policy: LPM trie. prefixlen counts the bits after it:
 * 96 = ep+dir+identity (any protocol, any port), 104..112 = + proto,
 * 112+n = + the first n bits of the port. */
struct pol_key {
	__u32 prefixlen;
	__u32 ep;
	__u8 dir;
	__u8 pad[3];
	__u32 identity;
	__u8 proto;
	__u8 pad2;
	__u16 port; /* network order */
};

struct pol_entry {
	__u32 policy; /* key of waggle_pol_names */
	__u16 rule;   /* index of the rule in the policy's ingress/egress list */
	__u16 flags;
	__u64 hits;   /* new flows this entry allowed */
};

/* waggle_pol_ipcache: HASH, pod and host addresses -> identity. */
struct pol_ip_key {
	__u8 addr[16];
};

struct pol_ip_info {
	__u32 identity;
	__u32 pad;
};

/* waggle_pol_cidr: LPM trie of ipBlock prefixes (and their excepts). */
struct pol_cidr_key {
	__u32 prefixlen; /* 0..128 (IPv4 prefixes: 96 + len) */
	__u8 addr[16];
};

/* waggle_pol_ct: LRU_HASH, one entry per flow and endpoint. */
struct pol_ct_key {
	__u32 ep;
	__u8 proto;
	__u8 pad[3];
	__u8 peer[16];
	__u16 local_port; /* network order */
	__u16 peer_port;  /* network order */
};

struct pol_ct {
	__u32 rev;    /* endpoint revision the flow was last checked at */
	__u32 policy; /* the policy that allowed it (0: none needed) */
	__u8 origin;  /* POL_DIR_* of the flow's first packet */
	__u8 pad[7];
	__u64 created_ns;
};

/* waggle_pol_events: RINGBUF of pol_event. */
struct pol_event {
	__u64 ts_ns;
	__u32 ep;
	__u32 peer_identity;
	__u32 policy;
	__u16 rule;
	__u8 dir;
	__u8 verdict;
	__u8 reason;
	__u8 proto;
	__u16 peer_port;  /* network order */
	__u16 local_port; /* network order */
	__u16 pad;
	__u8 peer[16];
	__u8 local[16];
};

/* waggle_pol_names: HASH, user space only: what IDs stand for, so that
 * `waggle bpf policy` can name them from the pinned maps alone. */
#define POL_NAME_POLICY 1   /* id: policy ID; name: namespace/name */
#define POL_NAME_ENDPOINT 2 /* id: ifindex; name: namespace/name of the pod */
#define POL_NAME_IDENTITY 3 /* id: identity; name: ns=... labels */

struct pol_name_key {
	__u32 kind;
	__u32 id;
};

struct pol_name {
	char name[256];
};

/* waggle_pol_config: ARRAY, 1 entry. */
struct pol_config {
	__u32 magic;
	__u32 layout_version;
	__u32 monitor;
	__u32 pad;
	__u64 events_lost;
};

#endif
