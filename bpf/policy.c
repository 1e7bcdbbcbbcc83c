//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * NetworkPolicy enforcement at each pod's host-side veth (tcx): the ingress
 * hook of the veth sees what the pod sends (the pod's egress), the egress
 * hook what the pod receives (its ingress). Peers are resolved to numeric
 * identities (waggle_pol_ipcache for pods and the node, waggle_pol_cidr for
 * ipBlock prefixes); the per-endpoint policy entries are looked up by
 * {endpoint, direction, identity, protocol, port prefix}. A conntrack entry
 * lets replies and established flows pass; when the endpoint's policy
 * revision moves on, an established flow is checked once more against the
 * new policy. bpf/README.md describes every map.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "policy.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Keeps struct pol_event in BTF for bpf2go -type (the ring buffer has no
 * value type of its own). */
const struct pol_event *unused_pol_event __attribute__((unused));

#ifndef TCX_NEXT
#define TCX_NEXT -1
#define TCX_DROP 2
#endif

#define IPPROTO_ICMPV6_ 58

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct pol_endpoint);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct pol_key);
	__type(value, struct pol_entry);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pol_ip_key);
	__type(value, struct pol_ip_info);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_ipcache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct pol_cidr_key);
	__type(value, struct pol_ip_info);
	__uint(max_entries, 1 << 14);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_cidr SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct pol_ct_key);
	__type(value, struct pol_ct);
	__uint(max_entries, 1 << 17);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 18);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct pol_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct pol_name_key);
	__type(value, struct pol_name);
	__uint(max_entries, 1 << 16);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_pol_names SEC(".maps");

/* A packet as the endpoint sees it. */
struct pkt {
	__u8 local[16];
	__u8 peer[16];
	__u16 local_port;
	__u16 peer_port;
	__u8 proto;
	__u8 always; /* neighbour discovery: never subject to policy */
};

static __always_inline void v4mapped(__u8 *dst, __u32 ip4)
{
	__u32 *w = (__u32 *)dst;

	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = ip4;
}

static __always_inline void copy16(__u8 *dst, const __u8 *src)
{
	__u32 *d = (__u32 *)dst;
	const __u32 *s = (const __u32 *)src;

	d[0] = s[0];
	d[1] = s[1];
	d[2] = s[2];
	d[3] = s[3];
}

/* parse fills p from the packet; dir says which address is the pod's.
 * Returns 0 when the packet is not IP (policy does not apply). */
static __always_inline int parse(struct __sk_buff *skb, __u8 dir, struct pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u16 sport = 0, dport = 0;
	void *l4;
	__u8 proto;

	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return 0;
		proto = ip->protocol;
		if (dir == POL_DIR_EGRESS) {
			v4mapped(p->local, ip->saddr);
			v4mapped(p->peer, ip->daddr);
		} else {
			v4mapped(p->local, ip->daddr);
			v4mapped(p->peer, ip->saddr);
		}
		/* A non-first fragment has no ports: it is checked with port 0. */
		if (ip->frag_off & bpf_htons(0x1fff))
			goto done;
		l4 = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			return 0;
		proto = ip6->nexthdr;
		if (dir == POL_DIR_EGRESS) {
			copy16(p->local, ip6->saddr.in6_u.u6_addr8);
			copy16(p->peer, ip6->daddr.in6_u.u6_addr8);
		} else {
			copy16(p->local, ip6->daddr.in6_u.u6_addr8);
			copy16(p->peer, ip6->saddr.in6_u.u6_addr8);
		}
		l4 = (void *)(ip6 + 1);
		if (proto == IPPROTO_ICMPV6_) {
			__u8 *type = l4;

			if ((void *)(type + 1) > end)
				return 0;
			/* Router/neighbour solicitation and advertisement, redirect. */
			if (*type >= 133 && *type <= 137)
				p->always = 1;
			goto done;
		}
	} else {
		return 0;
	}
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP) {
		__u16 *ports = l4;

		if ((void *)(ports + 2) > end)
			return 0;
		sport = ports[0];
		dport = ports[1];
	}
done:
	p->proto = proto;
	if (dir == POL_DIR_EGRESS) {
		p->local_port = sport;
		p->peer_port = dport;
	} else {
		p->local_port = dport;
		p->peer_port = sport;
	}
	return 1;
}

struct verdict {
	__u32 policy;
	__u32 peer_identity;
	__u16 rule;
	__u8 reason;
	__u8 allow;
};

static __always_inline struct pol_entry *lookup_rule(__u32 ep, __u8 dir, __u32 identity, __u8 proto, __u16 port)
{
	struct pol_key k = {
		.prefixlen = 128,
		.ep = ep,
		.dir = dir,
		.identity = identity,
		.proto = proto,
		.port = port,
	};

	return bpf_map_lookup_elem(&waggle_pol_policy, &k);
}

/* check decides a flow that starts in direction dir with the given peer and
 * destination port (the peer's port for egress, the pod's for ingress). */
static __always_inline void check(__u32 ep, const struct pol_endpoint *e, __u8 dir, const __u8 *peer,
				  __u8 proto, __u16 dport, struct verdict *v)
{
	struct pol_ip_key ik;
	struct pol_cidr_key ck = { .prefixlen = 128 };
	struct pol_ip_info *info;
	struct pol_entry *r = 0;
	__u32 label = 0, cidr = 0;

	copy16(ik.addr, peer);
	copy16(ck.addr, peer);
	info = bpf_map_lookup_elem(&waggle_pol_ipcache, &ik);
	if (info)
		label = info->identity;
	info = bpf_map_lookup_elem(&waggle_pol_cidr, &ck);
	if (info)
		cidr = info->identity;
	v->peer_identity = label ? label : (cidr ? cidr : POL_ID_WORLD);

	/* Traffic to and from the pod's own node is always allowed (upstream:
	 * kubelet probes; and Waggle's cluster DNS answers on the node). */
	if (label == POL_ID_HOST) {
		v->allow = 1;
		v->reason = POL_REASON_HOST;
		return;
	}
	if (!(e->flags & (dir == POL_DIR_INGRESS ? POL_EP_INGRESS_ISOLATED : POL_EP_EGRESS_ISOLATED))) {
		v->allow = 1;
		v->reason = POL_REASON_NOT_ISOLATED;
		return;
	}
	if (label)
		r = lookup_rule(ep, dir, label, proto, dport);
	if (!r && cidr)
		r = lookup_rule(ep, dir, cidr, proto, dport);
	if (!r)
		r = lookup_rule(ep, dir, POL_ID_ANY, proto, dport);
	if (r) {
		v->allow = 1;
		v->reason = POL_REASON_POLICY;
		v->policy = r->policy;
		v->rule = r->rule;
		__sync_fetch_and_add(&r->hits, 1);
		return;
	}
	v->allow = 0;
	v->reason = POL_REASON_DEFAULT_DENY;
}

static __always_inline void emit(__u32 ep, __u8 dir, const struct pkt *p, const struct verdict *v)
{
	__u32 zero = 0;
	struct pol_config *cfg = bpf_map_lookup_elem(&waggle_pol_config, &zero);
	struct pol_event *ev;

	if (!cfg)
		return;
	if (!(cfg->monitor & (v->allow ? POL_MON_ALLOWS : POL_MON_DROPS)))
		return;
	ev = bpf_ringbuf_reserve(&waggle_pol_events, sizeof(*ev), 0);
	if (!ev) {
		__sync_fetch_and_add(&cfg->events_lost, 1);
		return;
	}
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ep = ep;
	ev->peer_identity = v->peer_identity;
	ev->policy = v->policy;
	ev->rule = v->rule;
	ev->dir = dir;
	ev->verdict = v->allow ? POL_VERDICT_ALLOW : POL_VERDICT_DROP;
	ev->reason = v->reason;
	ev->proto = p->proto;
	ev->peer_port = p->peer_port;
	ev->local_port = p->local_port;
	ev->pad = 0;
	copy16(ev->peer, p->peer);
	copy16(ev->local, p->local);
	bpf_ringbuf_submit(ev, 0);
}

static __always_inline int enforce(struct __sk_buff *skb, __u8 dir)
{
	__u32 ep = skb->ifindex;
	struct pol_endpoint *e = bpf_map_lookup_elem(&waggle_pol_endpoints, &ep);
	struct pkt p = {};
	struct pol_ct_key ck = {};
	struct pol_ct *ct;
	struct verdict v = {};

	if (!e)
		return TCX_NEXT;
	if (!parse(skb, dir, &p) || p.always)
		return TCX_NEXT;

	ck.ep = ep;
	ck.proto = p.proto;
	copy16(ck.peer, p.peer);
	ck.local_port = p.local_port;
	ck.peer_port = p.peer_port;
	ct = bpf_map_lookup_elem(&waggle_pol_ct, &ck);
	if (ct) {
		__u8 origin = ct->origin;

		if (ct->rev == e->rev)
			return TCX_NEXT;
		/* The policy changed since the flow was checked: check the flow's
		 * first direction again, as a new flow would be. */
		check(ep, e, origin, p.peer, p.proto, origin == POL_DIR_EGRESS ? p.peer_port : p.local_port, &v);
		if (v.allow) {
			ct->rev = e->rev;
			ct->policy = v.policy;
			return TCX_NEXT;
		}
		bpf_map_delete_elem(&waggle_pol_ct, &ck);
		v.reason = POL_REASON_CT_REVOKED;
		__sync_fetch_and_add(&e->denied[dir & 1], 1);
		emit(ep, dir, &p, &v);
		return TCX_DROP;
	}

	check(ep, e, dir, p.peer, p.proto, dir == POL_DIR_EGRESS ? p.peer_port : p.local_port, &v);
	if (!v.allow) {
		__sync_fetch_and_add(&e->denied[dir & 1], 1);
		emit(ep, dir, &p, &v);
		return TCX_DROP;
	}
	{
		struct pol_ct nct = {
			.rev = e->rev,
			.policy = v.policy,
			.origin = dir,
			.created_ns = bpf_ktime_get_ns(),
		};

		bpf_map_update_elem(&waggle_pol_ct, &ck, &nct, BPF_ANY);
	}
	__sync_fetch_and_add(&e->allowed[dir & 1], 1);
	emit(ep, dir, &p, &v);
	return TCX_NEXT;
}

/* Attached to tcx ingress of the host-side veth: what the pod sends. */
SEC("tc")
int waggle_pol_from_pod(struct __sk_buff *skb)
{
	return enforce(skb, POL_DIR_EGRESS);
}

/* Attached to tcx egress of the host-side veth: what the pod receives. */
SEC("tc")
int waggle_pol_to_pod(struct __sk_buff *skb)
{
	return enforce(skb, POL_DIR_INGRESS);
}
