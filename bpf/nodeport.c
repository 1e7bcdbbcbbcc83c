//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * North-south load balancing: NodePort, ExternalIP and LoadBalancer-IP
 * traffic that arrives on the node's external devices from outside, as
 * Cilium's bpf_host/nodeport does (ideas, not code).
 *
 *  tcx ingress of an external device (waggle_np_ingress):
 *    reply to a flow SNATed here?  -> restore frontend/client, forward
 *    established flow (ct)?        -> its backend, as long as it exists
 *    frontend in waggle_services with a Maglev table (a north-south kind)?
 *        no backends: Local -> drop; Cluster -> the stack (it rejects)
 *        backend: ClientIP affinity, else Maglev[hash % M], else slot hash
 *        remote backend (the route leaves through an external device):
 *            DNAT + SNAT to that device's address (a free port of the
 *            configured range); Local or a backend on this node: DNAT only,
 *            the client's address is kept
 *        conntrack entries for both directions, rewrite, FIB, redirect
 *  tcx egress of an external device (waggle_np_egress):
 *    reply of a backend on this node (no SNAT) -> source back to the frontend
 *  XDP on an external device (waggle_np_xdp, --bpf-lb-acceleration): the
 *    same ingress function (lib/ctx.h); forwards what leaves through an
 *    external device (new flows to remote backends, their packets, replies
 *    of SNATed flows) and passes everything else on to tc unchanged.
 *
 * IPv4 only; fragments are not translated; ICMP errors about north-south
 * flows are (ingress: SNATed ones, egress: DNAT-only ones; bpf/README.md).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "ctx.h"
#include "maps.h"
#include "nodeport.h"

char __license[] SEC("license") = "Dual BSD/GPL";

#ifndef TCX_NEXT
#define TCX_NEXT -1
#endif
#define AF_INET_ 2
#ifndef offsetof
#define offsetof(t, m) __builtin_offsetof(t, m)
#endif

#define NSEC 1000000000ULL
#define CT_LIFETIME_TCP (21600 * NSEC)
#define CT_LIFETIME_SYN (60 * NSEC)
#define CT_LIFETIME_NONTCP (60 * NSEC)
#define CT_LIFETIME_CLOSE (10 * NSEC)
#define CT_LIFETIME_RST (1 * NSEC)
#define SNAT_TRIES 32

#define IP_OFF ETH_HLEN
#define IP_CSUM_OFF (ETH_HLEN + offsetof(struct iphdr, check))
#define IP_TTL_OFF (ETH_HLEN + offsetof(struct iphdr, ttl))
#define IP_SRC_OFF (ETH_HLEN + offsetof(struct iphdr, saddr))
#define IP_DST_OFF (ETH_HLEN + offsetof(struct iphdr, daddr))

/* Keep the structs in BTF for bpf2go -type. */
const struct np_affinity_key *unused_np_affinity_key __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct np_ct_key);
	__type(value, struct np_ct);
	__uint(max_entries, NP_CT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct np_affinity_key);
	__type(value, struct np_affinity);
	__uint(max_entries, NP_AFFINITY_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct np_device);
	__uint(max_entries, NP_DEVICES_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_devices SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct np_config);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, NP_STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_stats SEC(".maps");

/* Which frontends are north-south, and their Maglev table. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct np_svc);
	__uint(max_entries, NP_SVC_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_svc SEC(".maps");

/* One Maglev table per distinct backend list, in chunks. A changed table
 * is written under a new ID before waggle_np_svc points at it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct np_maglev_key);
	__type(value, struct np_maglev_chunk);
	__uint(max_entries, NP_MAGLEV_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_maglev SEC(".maps");

/* loadBalancerSourceRanges of the frontends whose np_svc has
 * NP_SVC_F_SRC_RANGES; written before that flag is set. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct np_src_range_key);
	__type(value, __u8);
	__uint(max_entries, NP_SRC_RANGES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_src_ranges SEC(".maps");

static __always_inline void stat(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&waggle_np_stats, &i);
	if (c)
		*c += 1;
}

struct pkt {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 l4_off;
	__u16 tot_len;
	__u8 proto;
	__u8 tcp_flags; /* byte 13 of the TCP header */
	__u8 tos;
	__u8 ttl;
};

/* parse returns 0 for a TCP or UDP IPv4 packet, 1 for an IPv4 fragment, 2
 * for an unfragmented ICMP packet, -1 for anything else. */
static __always_inline int parse(void *ctx, const int xdp, struct pkt *p)
{
	void *data = ctx_data(ctx, xdp);
	void *end = ctx_data_end(ctx, xdp);
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;

	if ((void *)(ip + 1) > end)
		return -1;
	if ((xdp ? eth->h_proto : ((struct __sk_buff *)ctx)->protocol) != bpf_htons(ETH_P_IP))
		return -1;
	if (ip->ihl < 5 ||
	    (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_ICMP))
		return -1;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = ip->protocol;
	p->tos = ip->tos;
	p->ttl = ip->ttl;
	p->tot_len = bpf_ntohs(ip->tot_len);
	p->l4_off = ETH_HLEN + ip->ihl * 4;
	if (ip->frag_off & bpf_htons(0x3fff)) /* MF or an offset */
		return p->proto == IPPROTO_ICMP ? -1 : 1;
	if (p->proto == IPPROTO_ICMP)
		return 2;
	__be16 ports[2];
	if (ctx_load(ctx, xdp, p->l4_off, ports, sizeof(ports)) < 0)
		return -1;
	p->sport = ports[0];
	p->dport = ports[1];
	if (p->proto == IPPROTO_TCP && ctx_load(ctx, xdp, p->l4_off + 13, &p->tcp_flags, 1) < 0)
		return -1;
	return 0;
}

static __always_inline void mapped4(__u8 *a, __be32 v4)
{
	__builtin_memset(a, 0, 10);
	a[10] = 0xff;
	a[11] = 0xff;
	__builtin_memcpy(a + 12, &v4, 4);
}

static __always_inline int is_mapped4(const __u8 *a)
{
	for (int i = 0; i < 10; i++)
		if (a[i])
			return 0;
	return a[10] == 0xff && a[11] == 0xff;
}

static __always_inline __be32 v4of(const __u8 *a)
{
	__be32 v;
	__builtin_memcpy(&v, a + 12, 4);
	return v;
}

static __always_inline void ct_key(struct np_ct_key *k, __be32 src, __be16 sport, __be32 dst, __be16 dport,
				   __u8 proto, __u8 dir)
{
	mapped4(k->src, src);
	mapped4(k->dst, dst);
	k->sport = sport;
	k->dport = dport;
	k->proto = proto;
	k->dir = dir;
	k->pad[0] = 0;
	k->pad[1] = 0;
}

/* murmur3's 32-bit round and finalizer: the same on every node, so every
 * node picks the same Maglev entry for a flow. */
static __always_inline __u32 mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 fmix(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 flow_hash(const struct pkt *p)
{
	__u32 h = mix(0x5741474c, p->saddr);
	h = mix(h, p->daddr);
	h = mix(h, ((__u32)p->sport << 16) | p->dport);
	h = mix(h, p->proto);
	return fmix(h);
}

static __always_inline __u64 lifetime(const struct pkt *p, __u8 flags)
{
	if (p->proto != IPPROTO_TCP)
		return CT_LIFETIME_NONTCP;
	if (p->tcp_flags & 0x04) /* RST: no TIME_WAIT follows; free the SNAT port soon */
		return CT_LIFETIME_RST;
	if (flags & NP_CT_F_CLOSING)
		return CT_LIFETIME_CLOSE;
	if (!(flags & NP_CT_F_REPLIED))
		return CT_LIFETIME_SYN;
	return CT_LIFETIME_TCP;
}

/* tcp FIN (0x01) or RST (0x04) */
static __always_inline __u8 closing(const struct pkt *p)
{
	return p->proto == IPPROTO_TCP && (p->tcp_flags & 0x05) ? NP_CT_F_CLOSING : 0;
}

static __always_inline int csum_off(const struct pkt *p)
{
	return p->l4_off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check) : offsetof(struct udphdr, check));
}

static __always_inline int set_addr(void *ctx, const int xdp, const struct pkt *p, int off, __be32 old, __be32 new)
{
	__u64 l4 = BPF_F_PSEUDO_HDR | sizeof(new) | (p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0);
	if (old == new)
		return 0;
	if (ctx_l4_csum_replace(ctx, xdp, csum_off(p), old, new, l4) < 0)
		return -1;
	if (ctx_l3_csum_replace(ctx, xdp, IP_CSUM_OFF, old, new, sizeof(new)) < 0)
		return -1;
	return ctx_store(ctx, xdp, off, &new, sizeof(new));
}

static __always_inline int set_port(void *ctx, const int xdp, const struct pkt *p, int off, __be16 old, __be16 new)
{
	__u64 l4 = sizeof(new) | (p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0);
	if (old == new)
		return 0;
	if (ctx_l4_csum_replace(ctx, xdp, csum_off(p), old, new, l4) < 0)
		return -1;
	return ctx_store(ctx, xdp, p->l4_off + off, &new, sizeof(new));
}

static __always_inline int rewrite(void *ctx, const int xdp, const struct pkt *p, __be32 saddr, __be16 sport,
				   __be32 daddr, __be16 dport)
{
	if (set_addr(ctx, xdp, p, IP_SRC_OFF, p->saddr, saddr) < 0 ||
	    set_addr(ctx, xdp, p, IP_DST_OFF, p->daddr, daddr) < 0 || set_port(ctx, xdp, p, 0, p->sport, sport) < 0 ||
	    set_port(ctx, xdp, p, 2, p->dport, dport) < 0)
		return -1;
	return 0;
}

static __always_inline int fib(void *ctx, const int xdp, const struct pkt *p, __be32 saddr, __be32 daddr,
			       struct bpf_fib_lookup *f)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->family = AF_INET_;
	f->l4_protocol = p->proto;
	f->tot_len = p->tot_len;
	f->tos = p->tos;
	f->ifindex = ctx_ifindex(ctx, xdp);
	f->ipv4_src = saddr;
	f->ipv4_dst = daddr;
	return bpf_fib_lookup(ctx, f, sizeof(*f), 0);
}

/* forward sends the rewritten packet where the FIB said: the next hop's
 * MAC, one hop less, out of the device (a pod's veth or an external device).
 * XDP only forwards what the FIB resolved (SUCCESS) and what has TTL to
 * spare: its callers checked both before rewriting anything. */
static __always_inline int forward(void *ctx, const int xdp, int rc, struct bpf_fib_lookup *f)
{
	__u16 word, nword;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return xdp ? XDP_PASS : TC_ACT_OK; /* local, or no route: the stack decides */
	if (ctx_load(ctx, xdp, IP_TTL_OFF, &word, sizeof(word)) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	if ((bpf_ntohs(word) >> 8) <= 1)
		return xdp ? XDP_PASS : TC_ACT_OK; /* the stack sends time-exceeded */
	nword = bpf_htons(bpf_ntohs(word) - 0x100);
	if (ctx_l3_csum_replace(ctx, xdp, IP_CSUM_OFF, word, nword, sizeof(word)) < 0 ||
	    ctx_store(ctx, xdp, IP_TTL_OFF, &nword, sizeof(nword)) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		if (xdp)
			return XDP_PASS; /* not reached: XDP leaves unresolved neighbours to tc */
		struct bpf_redir_neigh nh = {.nh_family = AF_INET_, .ipv4_nh = f->ipv4_dst};
		return bpf_redirect_neigh(f->ifindex, &nh, sizeof(nh), 0);
	}
	if (ctx_store(ctx, xdp, 0, f->dmac, ETH_ALEN) < 0 || ctx_store(ctx, xdp, ETH_ALEN, f->smac, ETH_ALEN) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	if (xdp && f->ifindex == ctx_ifindex(ctx, xdp))
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

static __always_inline void mark_replied(__be32 client, __be16 cport, __be32 front, __be16 fport, __u8 proto,
					 __u8 flags)
{
	struct np_ct_key k;
	ct_key(&k, client, cport, front, fport, proto, NP_CT_ORIGINAL);
	struct np_ct *o = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (o && !(o->flags & NP_CT_F_REPLIED))
		o->flags |= NP_CT_F_REPLIED | flags;
	else if (o && flags)
		o->flags |= flags;
}

/* A FIN or RST seen in one direction shortens the other direction's entry
 * too: a flow's SNAT port is held by its reply entry, which the backend may
 * never refresh again after the client's RST. */
static __always_inline void close_other(__be32 src, __be16 sport, __be32 dst, __be16 dport, __u8 dir,
					const struct pkt *p, __u64 now)
{
	struct np_ct_key k;
	ct_key(&k, src, sport, dst, dport, p->proto, dir);
	struct np_ct *o = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (!o)
		return;
	o->flags |= NP_CT_F_CLOSING;
	__u64 exp = now + lifetime(p, o->flags);
	if (exp < o->expires_ns)
		o->expires_ns = exp;
}

static __always_inline int is_external(__u32 ifindex, __be32 *addr)
{
	struct np_device *d = bpf_map_lookup_elem(&waggle_np_devices, &ifindex);
	if (!d || !(d->flags & NP_DEV_F_EXTERNAL))
		return 0;
	*addr = d->addr4;
	return 1;
}

/* xdp_fwd_ok: XDP forwards a packet only to a resolved next hop behind an
 * external device (the client, or a remote backend). Everything else — an
 * unresolved neighbour (bpf_redirect_neigh is tc-only), a backend on this
 * node (a redirect from XDP to its veth would skip the tc programs there,
 * NetworkPolicy's among them), the node itself — is left to tc. */
static __always_inline int xdp_fwd_ok(int rc, struct bpf_fib_lookup *f)
{
	__be32 a;
	return rc == BPF_FIB_LKUP_RET_SUCCESS && is_external(f->ifindex, &a);
}

/* A reply to a flow whose source this node rewrote: back to the client,
 * from the frontend. */
static __always_inline int reply_snat(void *ctx, const int xdp, const struct pkt *p, struct np_ct *ct, __u64 now)
{
	struct bpf_fib_lookup f;
	__be32 client = v4of(ct->addr), front = v4of(ct->nat);
	__be16 cport = ct->port, fport = ct->nat_port;
	int rc = fib(ctx, xdp, p, front, client, &f);

	if (xdp && !xdp_fwd_ok(rc, &f))
		return XDP_PASS;
	mark_replied(client, cport, front, fport, p->proto, closing(p));
	if (closing(p))
		close_other(client, cport, front, fport, NP_CT_ORIGINAL, p, now);
	ct->flags |= closing(p) | NP_CT_F_REPLIED;
	ct->expires_ns = now + lifetime(p, ct->flags);
	ct->packets++;
	stat(NP_STAT_REPLY);
	if (xdp)
		stat(NP_STAT_XDP_FWD);
	if (rewrite(ctx, xdp, p, front, fport, client, cport) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	return forward(ctx, xdp, rc, &f);
}

/* ICMP errors (RFC 792: destination unreachable, including "fragmentation
 * needed", source quench, time exceeded, parameter problem) quote the header
 * and 8 bytes of the packet that caused them. */
#define ICMP_DEST_UNREACH_ 3
#define ICMP_SOURCE_QUENCH_ 4
#define ICMP_TIME_EXCEEDED_ 11
#define ICMP_PARAMETERPROB_ 12
#define ICMP_HLEN 8

/* icmp_store rewrites 4 (or 2) bytes inside an ICMP error's quoted packet
 * and updates the ICMP checksum, which covers them (ICMP has no
 * pseudo-header). */
static __always_inline int icmp_store(struct __sk_buff *skb, int icsum, int off, __u32 old, __u32 new, int size)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, icsum, old, new, size) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &new, size, 0);
}

/* icmp_error translates an ICMP error about a north-south flow so the
 * client's socket sees it (ECONNREFUSED, EMSGSIZE and path MTU,
 * EHOSTUNREACH): as an error about client -> frontend, from the frontend.
 *   ingress: from a remote backend (or a router on the way) about a flow
 *            SNATed here, quoting node:snat_port -> backend; forwarded.
 *   egress:  from a backend on this node about a DNAT-only flow, quoting
 *            client -> backend; goes on.
 * Anything else is left to the stack. */
static __always_inline int icmp_error(struct __sk_buff *skb, const struct pkt *p, __u64 now, int egress)
{
	__u8 type;
	struct iphdr in;
	__be16 ports[2];
	int icsum = p->l4_off + 2, ioff = p->l4_off + ICMP_HLEN;

	if (bpf_skb_load_bytes(skb, p->l4_off, &type, 1) < 0)
		return TCX_NEXT;
	if (type != ICMP_DEST_UNREACH_ && type != ICMP_SOURCE_QUENCH_ && type != ICMP_TIME_EXCEEDED_ &&
	    type != ICMP_PARAMETERPROB_)
		return TCX_NEXT;
	if (bpf_skb_load_bytes(skb, ioff, &in, sizeof(in)) < 0 || in.ihl != 5 ||
	    (in.protocol != IPPROTO_TCP && in.protocol != IPPROTO_UDP))
		return TCX_NEXT;
	if (bpf_skb_load_bytes(skb, ioff + sizeof(in), ports, sizeof(ports)) < 0)
		return TCX_NEXT;
	/* The quoted packet is node:snat_port -> backend: the flow's reply
	 * direction is backend -> node:snat_port. */
	struct np_ct_key k;
	ct_key(&k, in.daddr, ports[1], in.saddr, ports[0], in.protocol, NP_CT_REPLY);
	struct np_ct *ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (!ct && egress) {
		/* As for replies: the quote's backend side may have been
		 * masqueraded by the node's netfilter; find it by its client. */
		ct_key(&k, 0, 0, in.saddr, ports[0], in.protocol, NP_CT_CLIENT);
		ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	}
	if (!ct || !(ct->flags & NP_CT_F_SNAT) != !!egress || ct->expires_ns <= now)
		return TCX_NEXT;
	__be32 client = v4of(ct->addr), front = v4of(ct->nat);
	__be16 cport = ct->port, fport = ct->nat_port;
	int qcsum = ioff + offsetof(struct iphdr, check);
	__u16 oldsum = in.check, newsum;

	/* The quoted header: node -> client, backend -> frontend, with its own
	 * IP checksum; every changed word also changes the ICMP checksum. */
	if (bpf_l3_csum_replace(skb, qcsum, in.saddr, client, 4) < 0 ||
	    bpf_l3_csum_replace(skb, qcsum, in.daddr, front, 4) < 0 ||
	    bpf_skb_load_bytes(skb, qcsum, &newsum, 2) < 0 ||
	    icmp_store(skb, icsum, qcsum, oldsum, newsum, 2) < 0 ||
	    icmp_store(skb, icsum, ioff + offsetof(struct iphdr, saddr), in.saddr, client, 4) < 0 ||
	    icmp_store(skb, icsum, ioff + offsetof(struct iphdr, daddr), in.daddr, front, 4) < 0 ||
	    icmp_store(skb, icsum, ioff + sizeof(in), ports[0], cport, 2) < 0 ||
	    icmp_store(skb, icsum, ioff + sizeof(in) + 2, ports[1], fport, 2) < 0)
		return TC_ACT_SHOT;
	/* The outer header: frontend -> client (no pseudo-header for ICMP). */
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, p->saddr, front, 4) < 0 ||
	    bpf_skb_store_bytes(skb, IP_SRC_OFF, &front, 4, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, p->daddr, client, 4) < 0 ||
	    bpf_skb_store_bytes(skb, IP_DST_OFF, &client, 4, 0) < 0)
		return TC_ACT_SHOT;
	stat(NP_STAT_ICMP_ERROR);
	if (egress)
		return TCX_NEXT;
	struct bpf_fib_lookup f;
	int rc = fib(skb, CTX_TC, p, front, client, &f);
	return forward(skb, CTX_TC, rc, &f);
}

/* np_ingress is the ingress of an external device, in tc (xdp = CTX_TC)
 * or XDP (CTX_XDP). Both make the same decisions from the same maps; XDP
 * returns XDP_PASS, before changing any state, for whatever it leaves to tc
 * (see xdp_fwd_ok, and fragments, ICMP, offloaded checksums, TTL 1), which
 * then handles the packet as if XDP were not there. Counters XDP would
 * bump before such a hand-over (pend) are only counted once it commits. */
static __always_inline int np_ingress(void *ctx, const int xdp)
{
	struct pkt p = {};
	struct np_ct_key k;
	struct np_ct *ct;
	struct np_ct nv;
	struct bpf_fib_lookup f;
	__u32 zero = 0, be_id = 0, id, pend = 0;
	__u64 now;
	int rc, r;

	/* Only frames addressed to this node. A switch floods a frame for a
	 * MAC it has not learnt (the lab bridge: every frame for a node whose
	 * port just went down) to every port; the stack drops the copies
	 * (PACKET_OTHERHOST), and translating them here would make a node
	 * serve a LoadBalancer IP another node announces (two nodes answering
	 * one flow while both are up). XDP has no pkt_type: a frame it passes
	 * meets this check in tc; one it forwards (a new flow to a remote
	 * backend) is not checked (bpf/README.md). */
	if (!xdp && ((struct __sk_buff *)ctx)->pkt_type != PACKET_HOST)
		return TCX_NEXT;

	r = parse(ctx, xdp, &p);
	if (r < 0)
		return xdp ? XDP_PASS : TCX_NEXT;
	if (r == 1) {
		if (xdp)
			return XDP_PASS; /* tc counts it */
		stat(NP_STAT_FRAGMENT);
		return TCX_NEXT;
	}
	if (r == 2) {
		if (xdp)
			return XDP_PASS; /* ICMP errors are translated in tc */
		return icmp_error(ctx, &p, bpf_ktime_get_ns(), 0);
	}
	if (xdp) {
		__u16 check;
		if (p.ttl <= 1 || ctx_load(ctx, xdp, csum_off(&p), &check, 2) < 0)
			return XDP_PASS;
		if (csum_is_seed(check, p.saddr, p.daddr, p.proto, p.tot_len - (p.l4_off - ETH_HLEN))) {
			stat(NP_STAT_XDP_PARTIAL_CSUM);
			return XDP_PASS;
		}
	}
	now = bpf_ktime_get_ns();

	/* A reply to a flow SNATed here. */
	ct_key(&k, p.saddr, p.sport, p.daddr, p.dport, p.proto, NP_CT_REPLY);
	ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (ct && (ct->flags & NP_CT_F_SNAT) && ct->expires_ns > now)
		return reply_snat(ctx, xdp, &p, ct, now);

	/* An established flow keeps its backend while the backend exists. */
	ct_key(&k, p.saddr, p.sport, p.daddr, p.dport, p.proto, NP_CT_ORIGINAL);
	ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (ct && ct->expires_ns > now) {
		struct lb_backend *be = bpf_map_lookup_elem(&waggle_backends, &ct->backend_id);
		if (be && be->port == ct->port && v4of(be->addr) == v4of(ct->addr)) {
			__be32 baddr = v4of(ct->addr), saddr = p.saddr;
			__be16 bport = ct->port, sport = p.sport;
			rc = fib(ctx, xdp, &p, p.saddr, baddr, &f);
			if (xdp && !xdp_fwd_ok(rc, &f))
				return XDP_PASS;
			if (ct->flags & NP_CT_F_SNAT) {
				saddr = v4of(ct->nat);
				sport = ct->nat_port;
			}
			ct->flags |= closing(&p);
			ct->expires_ns = now + lifetime(&p, ct->flags);
			ct->packets++;
			if (closing(&p)) {
				close_other(baddr, bport, saddr, sport, NP_CT_REPLY, &p, now);
				if (!(ct->flags & NP_CT_F_SNAT))
					close_other(0, 0, p.saddr, p.sport, NP_CT_CLIENT, &p, now);
			}
			stat(NP_STAT_CT_HIT);
			if (xdp)
				stat(NP_STAT_XDP_FWD);
			if (rewrite(ctx, xdp, &p, saddr, sport, baddr, bport) < 0)
				return xdp ? XDP_DROP : TC_ACT_SHOT;
			return forward(ctx, xdp, rc, &f);
		}
		if (xdp)
			pend |= 1 << NP_STAT_BACKEND_GONE;
		else
			stat(NP_STAT_BACKEND_GONE);
	}

	/* A new flow to a north-south frontend? */
	struct lb_service_key sk = {};
	mapped4(sk.addr, p.daddr);
	sk.port = p.dport;
	sk.proto = p.proto;
	struct lb_service *svc = bpf_map_lookup_elem(&waggle_services, &sk);
	if (!svc)
		return xdp ? XDP_PASS : TCX_NEXT;
	id = svc->rev_nat_id;
	struct np_svc *ns = bpf_map_lookup_elem(&waggle_np_svc, &id);
	if (!ns)
		return xdp ? XDP_PASS : TCX_NEXT; /* a ClusterIP, or not yet programmed */
	__u32 table = ns->table;
	if (ns->flags & NP_SVC_F_SRC_RANGES) {
		struct np_src_range_key rk = {.prefixlen = 32 + 128, .rev_nat_id = bpf_htonl(id)};
		mapped4(rk.addr, p.saddr);
		if (!bpf_map_lookup_elem(&waggle_np_src_ranges, &rk)) {
			stat(NP_STAT_SRC_RANGE_DROP);
			return xdp ? XDP_DROP : TC_ACT_SHOT; /* kube-proxy drops too (KUBE-PROXY-FIREWALL) */
		}
	}
	if (svc->count == 0) {
		if (svc->flags & SVC_FLAG_LOCAL) {
			stat(NP_STAT_LOCAL_DROP);
			return xdp ? XDP_DROP : TC_ACT_SHOT;
		}
		if (xdp)
			return XDP_PASS; /* tc counts it */
		stat(NP_STAT_NO_BACKEND);
		return TCX_NEXT; /* no socket: the stack resets / port-unreachables */
	}
	struct np_config *cfg = bpf_map_lookup_elem(&waggle_np_config, &zero);
	if (!cfg || cfg->maglev_size == 0)
		return xdp ? XDP_PASS : TCX_NEXT;

	struct np_affinity_key ak = {};
	__u32 h;
	int new_affinity = 0;
	if (svc->flags & SVC_FLAG_AFFINITY) {
		mapped4(ak.client, p.saddr);
		ak.rev_nat_id = id;
		struct np_affinity *a = bpf_map_lookup_elem(&waggle_np_affinity, &ak);
		if (a && now - a->last_used_ns <= (__u64)svc->affinity_timeout * NSEC &&
		    bpf_map_lookup_elem(&waggle_backends, &a->backend_id)) {
			be_id = a->backend_id;
			a->last_used_ns = now;
			if (xdp)
				pend |= 1 << NP_STAT_AFFINITY_HIT;
			else
				stat(NP_STAT_AFFINITY_HIT);
		}
		h = fmix(mix(0x5741474c, p.saddr)); /* the client alone: every node agrees */
	} else {
		h = flow_hash(&p);
	}
	if (!be_id) {
		__u32 idx = h % cfg->maglev_size;
		struct np_maglev_key mk = {.table = table, .chunk = idx / NP_MAGLEV_CHUNK};
		struct np_maglev_chunk *c = table ? bpf_map_lookup_elem(&waggle_np_maglev, &mk) : 0;
		if (c)
			be_id = c->backend[idx & (NP_MAGLEV_CHUNK - 1)];
		if (!be_id) {
			if (xdp)
				pend |= 1 << NP_STAT_MAGLEV_MISS;
			else
				stat(NP_STAT_MAGLEV_MISS);
			sk.slot = h % svc->count + 1;
			struct lb_service *slot = bpf_map_lookup_elem(&waggle_services, &sk);
			if (!slot)
				return xdp ? XDP_PASS : TCX_NEXT;
			be_id = slot->backend_id;
		}
		new_affinity = svc->flags & SVC_FLAG_AFFINITY;
	}
	struct lb_backend *be = bpf_map_lookup_elem(&waggle_backends, &be_id);
	if (!be || !is_mapped4(be->addr))
		return xdp ? XDP_PASS : TCX_NEXT;
	__be32 baddr = v4of(be->addr), saddr = p.saddr, snat = 0;
	__be16 bport = be->port, sport = p.sport;
	__u8 local = svc->flags & SVC_FLAG_LOCAL;

	rc = fib(ctx, xdp, &p, p.saddr, baddr, &f);
	if (xdp && (local || !xdp_fwd_ok(rc, &f)))
		return XDP_PASS; /* a backend on this node, or no resolved route: tc */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && rc != BPF_FIB_LKUP_RET_NOT_FWDED) {
		stat(NP_STAT_FIB_MISS);
		return TCX_NEXT;
	}
	if (new_affinity) {
		struct np_affinity av = {.last_used_ns = now, .backend_id = be_id};
		bpf_map_update_elem(&waggle_np_affinity, &ak, &av, BPF_ANY);
	}
	__builtin_memset(&nv, 0, sizeof(nv));
	nv.created_ns = now;
	nv.rev_nat_id = id;
	nv.flags = closing(&p);
	if (!local && rc != BPF_FIB_LKUP_RET_NOT_FWDED && is_external(f.ifindex, &snat) && snat) {
		/* Remote backend: the reply must come back here. Find a free
		 * source port of the range for (backend, node address). */
		__u32 range = (__u32)cfg->snat_max - cfg->snat_min + 1;
		int found = 0;
		mapped4(nv.addr, p.saddr);
		nv.port = p.sport;
		mapped4(nv.nat, p.daddr);
		nv.nat_port = p.dport;
		nv.flags |= NP_CT_F_SNAT;
		for (int i = 0; i < SNAT_TRIES; i++) {
			__be16 port = bpf_htons(cfg->snat_min + (h + i * 2654435761u) % range);
			ct_key(&k, baddr, bport, snat, port, p.proto, NP_CT_REPLY);
			struct np_ct *old = bpf_map_lookup_elem(&waggle_np_ct, &k);
			if (old && old->expires_ns > now)
				continue;
			nv.expires_ns = now + lifetime(&p, nv.flags);
			if (bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY) == 0) {
				sport = port;
				found = 1;
				break;
			}
		}
		if (!found) {
			stat(NP_STAT_SNAT_EXHAUSTED);
			return xdp ? XDP_DROP : TC_ACT_SHOT;
		}
		saddr = snat;
		stat(NP_STAT_XLATE_SNAT);
	} else {
		mapped4(nv.addr, p.saddr);
		nv.port = p.sport;
		mapped4(nv.nat, p.daddr);
		nv.nat_port = p.dport;
		nv.expires_ns = now + lifetime(&p, nv.flags);
		ct_key(&k, baddr, bport, p.saddr, p.sport, p.proto, NP_CT_REPLY);
		bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY);
		ct_key(&k, 0, 0, p.saddr, p.sport, p.proto, NP_CT_CLIENT);
		bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY);
		stat(NP_STAT_XLATE_LOCAL);
	}
	if (xdp) {
		stat(NP_STAT_XDP_FWD);
		if (pend & (1 << NP_STAT_BACKEND_GONE))
			stat(NP_STAT_BACKEND_GONE);
		if (pend & (1 << NP_STAT_AFFINITY_HIT))
			stat(NP_STAT_AFFINITY_HIT);
		if (pend & (1 << NP_STAT_MAGLEV_MISS))
			stat(NP_STAT_MAGLEV_MISS);
	}
	/* The original direction: backend and SNAT source. */
	mapped4(nv.addr, baddr);
	nv.port = bport;
	if (nv.flags & NP_CT_F_SNAT) {
		mapped4(nv.nat, saddr);
		nv.nat_port = sport;
	} else {
		__builtin_memset(nv.nat, 0, sizeof(nv.nat));
		nv.nat_port = 0;
	}
	nv.backend_id = be_id;
	nv.packets = 1;
	ct_key(&k, p.saddr, p.sport, p.daddr, p.dport, p.proto, NP_CT_ORIGINAL);
	bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY);

	if (rewrite(ctx, xdp, &p, saddr, sport, baddr, bport) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	return forward(ctx, xdp, rc, &f);
}

SEC("tc")
int waggle_np_ingress(struct __sk_buff *skb)
{
	return np_ingress(skb, CTX_TC);
}

/* The same ingress in XDP (--bpf-lb-acceleration): the request path to
 * remote backends and the replies of SNATed flows, forwarded with XDP_TX
 * or XDP_REDIRECT; everything else goes on to tc (XDP_PASS). */
SEC("xdp")
int waggle_np_xdp(struct xdp_md *ctx)
{
	return np_ingress(ctx, CTX_XDP);
}

/* Replies of backends on this node leave through an external device with
 * the backend's address: show the frontend instead. */
SEC("tc")
int waggle_np_egress(struct __sk_buff *skb)
{
	struct pkt p = {};
	struct np_ct_key k;
	__u64 now;
	int r = parse(skb, CTX_TC, &p);

	if (r == 2)
		return icmp_error(skb, &p, bpf_ktime_get_ns(), 1);
	if (r != 0)
		return TCX_NEXT;
	ct_key(&k, p.saddr, p.sport, p.daddr, p.dport, p.proto, NP_CT_REPLY);
	struct np_ct *ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (!ct) {
		/* The node's netfilter may have masqueraded the backend's reply
		 * (tc egress runs after POSTROUTING): find the flow by its client. */
		ct_key(&k, 0, 0, p.daddr, p.dport, p.proto, NP_CT_CLIENT);
		ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	}
	if (!ct || (ct->flags & NP_CT_F_SNAT))
		return TCX_NEXT;
	now = bpf_ktime_get_ns();
	if (ct->expires_ns <= now)
		return TCX_NEXT;
	ct->flags |= closing(&p) | NP_CT_F_REPLIED;
	ct->expires_ns = now + lifetime(&p, ct->flags);
	ct->packets++;
	mark_replied(v4of(ct->addr), ct->port, v4of(ct->nat), ct->nat_port, p.proto, closing(&p));
	if (closing(&p))
		close_other(v4of(ct->addr), ct->port, v4of(ct->nat), ct->nat_port, NP_CT_ORIGINAL, &p, now);
	stat(NP_STAT_REPLY);
	if (rewrite(skb, CTX_TC, &p, v4of(ct->nat), ct->nat_port, p.daddr, p.dport) < 0)
		return TC_ACT_SHOT;
	return TCX_NEXT;
}
