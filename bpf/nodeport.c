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
 *            configured range), or with --bpf-lb-mode dsr/hybrid DNAT only
 *            and the frontend in an IPv4 option / IPv6 destination
 *            option for the backend's node;
 *            Local or a backend on this node: DNAT only, the client's
 *            address is kept
 *    a packet with the DSR option (this node hosts the backend): flow
 *        recorded for the egress program, option stripped, to the stack
 *        conntrack entries for both directions, rewrite, FIB, redirect
 *  tcx egress of an external device (waggle_np_egress):
 *    reply of a backend on this node (no SNAT, or a DSR flow another node
 *    dispatched here) -> source back to the frontend
 *  XDP on an external device (waggle_np_xdp, --bpf-lb-acceleration): the
 *    same ingress function (lib/ctx.h); forwards what leaves through an
 *    external device (new flows to remote backends, their packets, replies
 *    of SNATed flows) and passes everything else on to tc unchanged —
 *    every frame not unicast to the device's MAC among it.
 *
 * IPv4 and IPv6 (tc and XDP); fragmented datagrams in tc: the first
 * fragment's ports are kept in waggle_np_frag for the later fragments,
 * which take the same conntrack entry (XDP passes fragments to tc); ICMP
 * and ICMPv6 errors about north-south flows are translated (ingress:
 * SNATed ones, egress: DNAT-only ones; bpf/README.md); NDP and every other
 * ICMPv6 message pass untouched.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
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
#define AF_INET6_ 10
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
#define IP6_HOPLIMIT_OFF (ETH_HLEN + offsetof(struct ipv6hdr, hop_limit))
#define IP6_SRC_OFF (ETH_HLEN + offsetof(struct ipv6hdr, saddr))
#define IP6_DST_OFF (ETH_HLEN + offsetof(struct ipv6hdr, daddr))

/* Keep the structs in BTF for bpf2go -type. */
const struct np_affinity_key *unused_np_affinity_key __attribute__((unused));
const struct np_frag *unused_np_frag __attribute__((unused));

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

/* --bpf-lb-mode (NP_LB_MODE_*), written by the proxy at start. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_lb_mode SEC(".maps");

/* The first fragment's ports of each fragmented datagram a program
 * translated (written by tc only: XDP passes fragments on). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct np_frag_key);
	__type(value, struct np_frag);
	__uint(max_entries, NP_FRAG_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_np_frag SEC(".maps");

static __always_inline void stat(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&waggle_np_stats, &i);
	if (c)
		*c += 1;
}

/* A parsed packet. Addresses are IPv6 or IPv4-mapped (as every map stores
 * them), 4-byte aligned so W() reads them a word at a time. */
struct pkt {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 l4_off;
	__be32 flowinfo; /* IPv6: traffic class and flow label (for the FIB) */
	__u16 tot_len;   /* the IP packet's length, header included */
	__u8 proto;
	__u8 tcp_flags; /* byte 13 of the TCP header */
	__u8 tos;
	__u8 ttl; /* IPv6: hop limit */
	__u8 v6;
	__u8 frag;    /* FRAG_FIRST, FRAG_LATER or 0: not a fragment */
	__u32 frag_id; /* IPv4 ID (zero-extended) or IPv6 fragment identification */
	__u8 dsr_addr[16]; /* with the DSR option (dsr): the frontend it names */
	__be16 dsr_port;
	__u8 dsr;
} __attribute__((aligned(8)));

/* pkt.frag: the first fragment of a datagram (offset 0, more fragments:
 * it carries the L4 header), or a later one, whose ports came from
 * waggle_np_frag and which has no L4 header to rewrite. */
#define FRAG_FIRST 1
#define FRAG_LATER 2

/* Word i of a 16-byte address (every address field is 4-byte aligned). */
#define W(a, i) (((const __u32 *)(a))[i])

/* IS6: an IPv6 packet (in tc and in XDP alike). */
#define IS6(xdp, p) ((p)->v6)

static __always_inline void mapped4(__u8 *a, __be32 v4)
{
	((__u32 *)a)[0] = 0;
	((__u32 *)a)[1] = 0;
	((__u32 *)a)[2] = bpf_htonl(0xffff);
	((__u32 *)a)[3] = v4;
}

static __always_inline int is_mapped4(const __u8 *a)
{
	return W(a, 0) == 0 && W(a, 1) == 0 && W(a, 2) == bpf_htonl(0xffff);
}

static __always_inline void addr_copy(__u8 *d, const __u8 *s)
{
	((__u32 *)d)[0] = W(s, 0);
	((__u32 *)d)[1] = W(s, 1);
	((__u32 *)d)[2] = W(s, 2);
	((__u32 *)d)[3] = W(s, 3);
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	return W(a, 0) == W(b, 0) && W(a, 1) == W(b, 1) && W(a, 2) == W(b, 2) && W(a, 3) == W(b, 3);
}

static __always_inline void frag_key(struct np_frag_key *k, const struct pkt *p)
{
	addr_copy(k->src, p->saddr);
	addr_copy(k->dst, p->daddr);
	k->id = p->frag_id;
	k->proto = p->proto;
	k->pad[0] = 0;
	k->pad[1] = 0;
	k->pad[2] = 0;
}

/* frag_later handles a non-first fragment in parse: 0 with the ports of
 * its datagram's first fragment when a program translated that one
 * (waggle_np_frag), else 1 (a fragment left to the stack). XDP never looks:
 * it passes fragments to tc. */
static __always_inline int frag_later(const int xdp, struct pkt *p)
{
	struct np_frag_key k;
	if (xdp)
		return 1;
	p->frag = FRAG_LATER;
	frag_key(&k, p);
	struct np_frag *f = bpf_map_lookup_elem(&waggle_np_frag, &k);
	if (!f)
		return 1;
	p->sport = f->sport;
	p->dport = f->dport;
	return 0;
}

/* frag_note records a first fragment's ports for the later fragments of
 * its datagram, when it is translated. */
static __always_inline void frag_note(const struct pkt *p)
{
	struct np_frag_key k;
	struct np_frag v = {.sport = p->sport, .dport = p->dport};
	frag_key(&k, p);
	bpf_map_update_elem(&waggle_np_frag, &k, &v, BPF_ANY);
}

#define NEXTHDR_HOP_ 0
#define NEXTHDR_ROUTING_ 43
#define NEXTHDR_FRAGMENT_ 44
#define NEXTHDR_ESP_ 50
#define NEXTHDR_AUTH_ 51
#define NEXTHDR_DEST_ 60
#define NEXTHDR_MOBILITY_ 135
#define NEXTHDR_HIP_ 139
#define NEXTHDR_SHIM6_ 140
#define IPPROTO_ICMPV6_ 58
/* Hop-by-hop and destination options headers skipped before the L4 header. */
#define V6_EXTHDRS_MAX 4

/* parse6 is parse for IPv6. Hop-by-hop and destination options
 * headers are skipped; a fragment header directly followed by TCP or UDP
 * is a fragment (FRAG_FIRST, or FRAG_LATER through frag_later; an atomic
 * fragment, offset 0 and no more fragments, is a whole datagram), any other
 * is a fragment left to the stack (1); routing, AH,
 * ESP and the other extension headers, or more than V6_EXTHDRS_MAX options
 * headers, are left to the stack (3: counted). A UDP datagram with checksum
 * 0 is invalid in IPv6 (RFC 8200 8.1): the stack drops it (-1). */
static __always_inline int parse6(void *ctx, const int xdp, struct pkt *p)
{
	struct ipv6hdr ip6;
	__u32 off = ETH_HLEN + sizeof(ip6);
	__u8 nh, h[2];

	if (ctx_load(ctx, xdp, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
		return -1;
	p->v6 = 1;
	addr_copy(p->saddr, (__u8 *)&ip6.saddr);
	addr_copy(p->daddr, (__u8 *)&ip6.daddr);
	p->flowinfo = W(&ip6, 0) & bpf_htonl(0x0fffffff);
	p->ttl = ip6.hop_limit;
	p->tot_len = sizeof(ip6) + bpf_ntohs(ip6.payload_len);
	nh = ip6.nexthdr;
	if (nh == NEXTHDR_DEST_) {
		/* The DSR option, as an entry node inserts it: the first
		 * extension header, holding nothing else. */
		struct np_dsr_opt6 o;
		if (ctx_load(ctx, xdp, off, &o, sizeof(o)) == 0 && o.hdrlen == 2 && o.type == NP_DSR_OPT6_TYPE &&
		    o.len == NP_DSR_OPT6_LEN) {
			p->dsr = 1;
			addr_copy(p->dsr_addr, o.addr);
			p->dsr_port = o.port;
		}
	}
#pragma unroll
	for (int i = 0; i < V6_EXTHDRS_MAX; i++) {
		if (nh != NEXTHDR_HOP_ && nh != NEXTHDR_DEST_)
			break;
		if (ctx_load(ctx, xdp, off, h, 2) < 0)
			return -1;
		nh = h[0];
		off += ((__u32)h[1] + 1) * 8;
	}
	if (nh == NEXTHDR_FRAGMENT_) {
		struct {
			__u8 nexthdr;
			__u8 reserved;
			__be16 frag_off; /* offset << 3 | M */
			__be32 id;
		} fh;
		if (ctx_load(ctx, xdp, off, &fh, sizeof(fh)) < 0)
			return -1;
		if (fh.nexthdr != IPPROTO_TCP && fh.nexthdr != IPPROTO_UDP)
			return 1;
		nh = fh.nexthdr;
		off += sizeof(fh);
		p->proto = nh;
		p->l4_off = off;
		p->frag_id = fh.id;
		if (fh.frag_off & bpf_htons(0xfff8))
			return frag_later(xdp, p);
		if (fh.frag_off & bpf_htons(1))
			p->frag = FRAG_FIRST;
	}
	p->proto = nh;
	p->l4_off = off;
	switch (nh) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
		break;
	case IPPROTO_ICMPV6_:
		return 2;
	case NEXTHDR_HOP_:
	case NEXTHDR_DEST_:
	case NEXTHDR_ROUTING_:
	case NEXTHDR_ESP_:
	case NEXTHDR_AUTH_:
	case NEXTHDR_MOBILITY_:
	case NEXTHDR_HIP_:
	case NEXTHDR_SHIM6_:
		return 3;
	default:
		return -1;
	}
	__be16 l4[4];
	if (ctx_load(ctx, xdp, off, l4, sizeof(l4)) < 0)
		return -1;
	p->sport = l4[0];
	p->dport = l4[1];
	if (nh == IPPROTO_UDP && l4[3] == 0)
		return -1;
	if (nh == IPPROTO_TCP && ctx_load(ctx, xdp, off + 13, &p->tcp_flags, 1) < 0)
		return -1;
	return 0;
}

/* parse returns 0 for a TCP or UDP packet (a whole datagram, a first
 * fragment, or a later fragment whose first fragment was translated: pkt.frag
 * says which), 1 for a fragment left to the stack, 2 for an
 * unfragmented ICMP or ICMPv6 packet, 3 for an IPv6 packet whose extension
 * headers are not handled, -1 for anything else. */
static __always_inline int parse(void *ctx, const int xdp, struct pkt *p)
{
	void *data = ctx_data(ctx, xdp);
	void *end = ctx_data_end(ctx, xdp);
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;

	if (data + ETH_HLEN > end)
		return -1;
	if ((xdp ? eth->h_proto : ((struct __sk_buff *)ctx)->protocol) == bpf_htons(ETH_P_IPV6))
		return parse6(ctx, xdp, p);
	if ((void *)(ip + 1) > end)
		return -1;
	if ((xdp ? eth->h_proto : ((struct __sk_buff *)ctx)->protocol) != bpf_htons(ETH_P_IP))
		return -1;
	if (ip->ihl < 5 ||
	    (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_ICMP))
		return -1;
	mapped4(p->saddr, ip->saddr);
	mapped4(p->daddr, ip->daddr);
	p->proto = ip->protocol;
	p->tos = ip->tos;
	p->ttl = ip->ttl;
	p->tot_len = bpf_ntohs(ip->tot_len);
	p->l4_off = ETH_HLEN + ip->ihl * 4;
	if (ip->ihl == 7) {
		/* Only the DSR option, right after the fixed header (as an
		 * entry node in DSR mode inserts it), is looked for. */
		__u8 opt[NP_DSR_OPT4_LEN];
		if (ctx_load(ctx, xdp, ETH_HLEN + sizeof(*ip), opt, sizeof(opt)) == 0 && opt[0] == NP_DSR_OPT4_TYPE &&
		    opt[1] == NP_DSR_OPT4_LEN) {
			p->dsr = 1;
			__be32 a;
			__builtin_memcpy(&p->dsr_port, &opt[2], 2);
			__builtin_memcpy(&a, &opt[4], 4);
			mapped4(p->dsr_addr, a);
		}
	}
	if (ip->frag_off & bpf_htons(0x3fff)) { /* MF or an offset */
		if (p->proto == IPPROTO_ICMP)
			return -1;
		p->frag_id = ip->id;
		if (ip->frag_off & bpf_htons(0x1fff))
			return frag_later(xdp, p);
		p->frag = FRAG_FIRST;
	}
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

/* csum_is_seed6 is csum_is_seed (lib/ctx.h) with IPv6 addresses. */
static __always_inline int csum_is_seed6(__u16 check, const __u8 *saddr, const __u8 *daddr, __u8 proto, __u16 l4_len)
{
	__u32 s = bpf_htons((__u16)proto) + bpf_htons(l4_len);
	for (int i = 0; i < 4; i++) {
		s += (W(saddr, i) & 0xffff) + (W(saddr, i) >> 16);
		s += (W(daddr, i) & 0xffff) + (W(daddr, i) >> 16);
	}
	return check == csum_fold16(s);
}

/* ct_key: src NULL is the zero address (NP_CT_CLIENT entries). */
static __always_inline void ct_key(struct np_ct_key *k, const __u8 *src, __be16 sport, const __u8 *dst,
				   __be16 dport, __u8 proto, __u8 dir)
{
	if (src) {
		addr_copy(k->src, src);
	} else {
		((__u32 *)k->src)[0] = 0;
		((__u32 *)k->src)[1] = 0;
		((__u32 *)k->src)[2] = 0;
		((__u32 *)k->src)[3] = 0;
	}
	addr_copy(k->dst, dst);
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

/* addr_mix mixes an address in: IPv4 as its 4 bytes (the hash of the
 * first IPv4-only programs), IPv6 as its four words. */
static __always_inline __u32 addr_mix(__u32 h, const __u8 *a, __u8 v6)
{
	if (v6) {
		h = mix(h, W(a, 0));
		h = mix(h, W(a, 1));
		h = mix(h, W(a, 2));
	}
	return mix(h, W(a, 3));
}

static __always_inline __u32 flow_hash(const struct pkt *p, const int xdp)
{
	__u32 h = addr_mix(0x5741474c, p->saddr, IS6(xdp, p));
	h = addr_mix(h, p->daddr, IS6(xdp, p));
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

/* csum_diff16 is the one's-complement difference of two 16-byte addresses,
 * for bpf_l4_csum_replace(from 0, to diff, size 0). */
static __always_inline __s64 csum_diff16(const __u8 *old, const __u8 *new)
{
	return bpf_csum_diff((__be32 *)old, 16, (__be32 *)new, 16, 0);
}

/* rewrite translates the packet to saddr:sport -> daddr:dport, in as few
 * helper calls as the checksum rules allow. When both addresses change
 * (SNAT + DNAT, and its reply), they are stored at once (adjacent in the
 * IP header) and their change summed once (bpf_csum_diff) and applied once
 * to the IPv4 header checksum and once, as pseudo-header, to the L4
 * checksum (IPv6 has no header checksum); when both ports change, one
 * store and one L4 update, not as pseudo-header (an offloaded checksum
 * covers them when it is completed). A lone address or port (DNAT only,
 * its reverse) is replaced by itself, which takes fewer calls. A later
 * fragment has no L4 header: the first fragment's checksum update covered
 * the datagram's pseudo-header change. A first fragment's ports are noted
 * for the rest of its datagram, whose fragments then take the same path. */
static __always_inline int rewrite(void *ctx, const int xdp, const struct pkt *p, const __u8 *saddr, __be16 sport,
				   const __u8 *daddr, __be16 dport)
{
	__u64 mangled = p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	int l4 = p->frag != FRAG_LATER;
	__s64 d;

	if (!xdp && p->frag == FRAG_FIRST)
		frag_note(p);
	if (!xdp && p->frag == FRAG_LATER)
		stat(NP_STAT_FRAG_XLATE);
	int ds = !addr_eq(p->saddr, saddr), dd = !addr_eq(p->daddr, daddr);
	if (IS6(xdp, p)) {
		if (ds || dd) {
			if (l4) {
				d = ds ? csum_diff16(p->saddr, saddr) : 0;
				if (dd && d >= 0)
					d = bpf_csum_diff((__be32 *)p->daddr, 16, (__be32 *)daddr, 16, d);
				if (d < 0 || ctx_l4_csum_diff(ctx, xdp, csum_off(p), d, BPF_F_PSEUDO_HDR | mangled) < 0)
					return -1;
			}
			if ((ds && ctx_store(ctx, xdp, IP6_SRC_OFF, (void *)saddr, 16) < 0) ||
			    (dd && ctx_store(ctx, xdp, IP6_DST_OFF, (void *)daddr, 16) < 0))
				return -1;
		}
	} else if (ds && dd) {
		__u32 o[2] = {W(p->saddr, 3), W(p->daddr, 3)}, n[2] = {W(saddr, 3), W(daddr, 3)};
		d = bpf_csum_diff(o, sizeof(o), n, sizeof(n), 0);
		if (d < 0 || (l4 && ctx_l4_csum_diff(ctx, xdp, csum_off(p), d, BPF_F_PSEUDO_HDR | mangled) < 0) ||
		    ctx_l3_csum_diff(ctx, xdp, IP_CSUM_OFF, d) < 0 || ctx_store(ctx, xdp, IP_SRC_OFF, n, sizeof(n)) < 0)
			return -1;
	} else if (ds || dd) {
		__be32 o = ds ? W(p->saddr, 3) : W(p->daddr, 3), n = ds ? W(saddr, 3) : W(daddr, 3);
		if ((l4 && ctx_l4_csum_replace(ctx, xdp, csum_off(p), o, n, BPF_F_PSEUDO_HDR | sizeof(n) | mangled) < 0) ||
		    ctx_l3_csum_replace(ctx, xdp, IP_CSUM_OFF, o, n, sizeof(n)) < 0 ||
		    ctx_store(ctx, xdp, ds ? IP_SRC_OFF : IP_DST_OFF, &n, sizeof(n)) < 0)
			return -1;
	}
	int ps = p->sport != sport, pd = p->dport != dport;
	if (!l4 || !(ps || pd))
		return 0;
	if (ps && pd) {
		__be16 op[2] = {p->sport, p->dport}, np[2] = {sport, dport};
		d = bpf_csum_diff((__be32 *)op, sizeof(op), (__be32 *)np, sizeof(np), 0);
		if (d < 0 || ctx_l4_csum_diff(ctx, xdp, csum_off(p), d, mangled) < 0)
			return -1;
		return ctx_store(ctx, xdp, p->l4_off, np, sizeof(np));
	}
	__be16 o = ps ? p->sport : p->dport, n = ps ? sport : dport;
	if (ctx_l4_csum_replace(ctx, xdp, csum_off(p), o, n, sizeof(n) | mangled) < 0)
		return -1;
	return ctx_store(ctx, xdp, p->l4_off + (ps ? 0 : 2), &n, sizeof(n));
}

static __always_inline int fib(void *ctx, const int xdp, const struct pkt *p, const __u8 *saddr, const __u8 *daddr,
			       struct bpf_fib_lookup *f)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->l4_protocol = p->proto;
	/* tc: no tot_len, so the kernel checks the skb against the egress
	 * device's MTU the GSO-aware way (is_skb_forwardable); a tot_len is
	 * compared as it is, and a GRO/GSO packet's exceeds the MTU (the
	 * lookup said FRAG_NEEDED and the packet took the stack's path). XDP
	 * frames are never GSO. */
	if (xdp)
		f->tot_len = p->tot_len;
	f->ifindex = ctx_ifindex(ctx, xdp);
	if (IS6(xdp, p)) {
		f->family = AF_INET6_;
		f->flowinfo = p->flowinfo;
		addr_copy((__u8 *)f->ipv6_src, saddr);
		addr_copy((__u8 *)f->ipv6_dst, daddr);
	} else {
		f->family = AF_INET_;
		f->tos = p->tos;
		f->ipv4_src = W(saddr, 3);
		f->ipv4_dst = W(daddr, 3);
	}
	return bpf_fib_lookup(ctx, f, sizeof(*f), 0);
}

/* forward sends the rewritten packet where the FIB said: the next hop's
 * MAC, one hop less (IPv4 TTL with its header checksum, IPv6 hop limit),
 * out of the device (a pod's veth or an external device). XDP only
 * forwards what the FIB resolved (SUCCESS) and what has TTL to spare: its
 * callers checked both before rewriting anything. */
static __always_inline int forward(void *ctx, const int xdp, const struct pkt *p, int rc, struct bpf_fib_lookup *f)
{
	__u16 word, nword;
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return xdp ? XDP_PASS : TC_ACT_OK; /* local, or no route: the stack decides */
	if (IS6(xdp, p)) {
		__u8 hl;
		if (ctx_load(ctx, xdp, IP6_HOPLIMIT_OFF, &hl, 1) < 0)
			return xdp ? XDP_DROP : TC_ACT_SHOT;
		if (hl <= 1)
			return xdp ? XDP_PASS : TC_ACT_OK; /* the stack sends time-exceeded */
		hl--;
		if (ctx_store(ctx, xdp, IP6_HOPLIMIT_OFF, &hl, 1) < 0)
			return xdp ? XDP_DROP : TC_ACT_SHOT;
		if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
			if (xdp)
				return XDP_PASS; /* not reached: XDP leaves unresolved neighbours to tc */
			struct bpf_redir_neigh nh = {.nh_family = AF_INET6_};
			addr_copy((__u8 *)nh.ipv6_nh, (__u8 *)f->ipv6_dst);
			return bpf_redirect_neigh(f->ifindex, &nh, sizeof(nh), 0);
		}
	} else {
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
	}
	if (ctx_store(ctx, xdp, 0, f->dmac, ETH_ALEN) < 0 || ctx_store(ctx, xdp, ETH_ALEN, f->smac, ETH_ALEN) < 0)
		return xdp ? XDP_DROP : TC_ACT_SHOT;
	if (xdp && f->ifindex == ctx_ifindex(ctx, xdp))
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

static __always_inline void mark_replied(const __u8 *client, __be16 cport, const __u8 *front, __be16 fport,
					 __u8 proto, __u8 flags)
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
static __always_inline void close_other(const __u8 *src, __be16 sport, const __u8 *dst, __be16 dport, __u8 dir,
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

/* reopen: a SYN (no ACK) on a flow that closed, whose original entry ct
 * still lives: the client reuses its tuple for a new connection (its port
 * comes round again within the 1 s an RST leaves the entries). The close
 * shortened the reply entry too; renew it with the original one, or the
 * backend's SYN-ACK, arriving after it expired, is not translated back and
 * this node's stack answers it with an RST (the client then times out).
 * Returns 0 when the reply entry expired already or now belongs to another
 * flow (its SNAT port was taken again): the SYN then starts a new flow. */
static __always_inline int reopen(struct np_ct *ct, const struct pkt *p, __u64 now)
{
	struct np_ct_key k;
	int snat = ct->flags & NP_CT_F_SNAT;

	ct_key(&k, ct->addr, ct->port, snat ? ct->nat : p->saddr, snat ? ct->nat_port : p->sport, p->proto, NP_CT_REPLY);
	struct np_ct *o = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (!o || o->expires_ns <= now || o->port != p->sport || !addr_eq(o->addr, p->saddr))
		return 0;
	o->flags &= ~(NP_CT_F_CLOSING | NP_CT_F_REPLIED);
	o->expires_ns = now + CT_LIFETIME_SYN;
	if (!snat) {
		ct_key(&k, 0, 0, p->saddr, p->sport, p->proto, NP_CT_CLIENT);
		o = bpf_map_lookup_elem(&waggle_np_ct, &k);
		if (o) {
			o->flags &= ~(NP_CT_F_CLOSING | NP_CT_F_REPLIED);
			o->expires_ns = now + CT_LIFETIME_SYN;
		}
	}
	ct->flags &= ~(NP_CT_F_CLOSING | NP_CT_F_REPLIED);
	return 1;
}

/* ext_dev returns the np_device of an external device, or NULL. */
static __always_inline struct np_device *ext_dev(__u32 ifindex)
{
	struct np_device *d = bpf_map_lookup_elem(&waggle_np_devices, &ifindex);
	if (!d || !(d->flags & NP_DEV_F_EXTERNAL))
		return 0;
	return d;
}

/* snat_addr fills addr with the device's SNAT source of the packet's
 * family; 0 when the device has none. */
static __always_inline int snat_addr(const struct np_device *d, int v6, __u8 *addr)
{
	if (v6) {
		addr_copy(addr, d->addr6);
		return W(addr, 0) | W(addr, 1) | W(addr, 2) | W(addr, 3);
	}
	mapped4(addr, d->addr4);
	return d->addr4 != 0;
}

/* xdp_fwd_ok: XDP forwards a packet only to a resolved next hop behind an
 * external device (the client, or a remote backend). Everything else — an
 * unresolved neighbour (bpf_redirect_neigh is tc-only), a backend on this
 * node (a redirect from XDP to its veth would skip the tc programs there,
 * NetworkPolicy's among them), the node itself — is left to tc. */
static __always_inline int xdp_fwd_ok(int rc, struct bpf_fib_lookup *f)
{
	return rc == BPF_FIB_LKUP_RET_SUCCESS && ext_dev(f->ifindex);
}

/* xdp_for_device reports whether an XDP frame is unicast to the MAC of the
 * device it arrived on (what eth_type_trans would call PACKET_HOST): not
 * broadcast or multicast (the group bit), not another machine's MAC. A
 * device whose np_device has no MAC (all zero) accepts every unicast
 * frame. */
static __always_inline int xdp_for_device(void *ctx)
{
	void *data = ctx_data(ctx, CTX_XDP);
	void *end = ctx_data_end(ctx, CTX_XDP);
	__u32 ifindex = ctx_ifindex(ctx, CTX_XDP);
	const __u8 *dst = data;

	if (data + ETH_HLEN > end || (dst[0] & 1))
		return 0;
	struct np_device *d = bpf_map_lookup_elem(&waggle_np_devices, &ifindex);
	if (!d)
		return 0;
	__u8 any = d->mac[0] | d->mac[1] | d->mac[2] | d->mac[3] | d->mac[4] | d->mac[5];
	__u8 diff = (dst[0] ^ d->mac[0]) | (dst[1] ^ d->mac[1]) | (dst[2] ^ d->mac[2]) | (dst[3] ^ d->mac[3]) |
		    (dst[4] ^ d->mac[4]) | (dst[5] ^ d->mac[5]);
	return !any || !diff;
}

/* A reply to a flow whose source this node rewrote: back to the client,
 * from the frontend. */
static __always_inline int reply_snat(void *ctx, const int xdp, const struct pkt *p, struct np_ct *ct, __u64 now)
{
	struct bpf_fib_lookup f;
	const __u8 *client = ct->addr, *front = ct->nat;
	__be16 cport = ct->port, fport = ct->nat_port;
	int rc = fib(ctx, xdp, p, front, client, &f);

	if (xdp && !xdp_fwd_ok(rc, &f))
		return XDP_PASS;
	/* The original entry learns of the answer once (with this entry: they
	 * gain and lose REPLIED together, reopen clears both), and of a close. */
	if (!(ct->flags & NP_CT_F_REPLIED) || closing(p))
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
	return forward(ctx, xdp, p, rc, &f);
}

/* ICMP errors (RFC 792: destination unreachable, including "fragmentation
 * needed", source quench, time exceeded, parameter problem) quote the header
 * and 8 bytes of the packet that caused them. */
#define ICMP_DEST_UNREACH_ 3
#define ICMP_SOURCE_QUENCH_ 4
#define ICMP_TIME_EXCEEDED_ 11
#define ICMP_PARAMETERPROB_ 12
#define ICMP_HLEN 8
/* ICMPv6 errors (RFC 4443): destination unreachable, packet too big, time
 * exceeded, parameter problem. Informational messages (echo, NDP, MLD:
 * types 128 and up) are never touched. */
#define ICMPV6_DEST_UNREACH_ 1
#define ICMPV6_PARAMPROB_ 4

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

/* icmp6_store16 rewrites a 16-byte address in an ICMPv6 error and its
 * checksum: pseudo for the outer header's (ICMPv6 has a pseudo-header),
 * plain for the quoted one's. */
static __always_inline int icmp6_store16(struct __sk_buff *skb, int icsum, int off, const __u8 *old, const __u8 *new,
					 __u64 pseudo)
{
	if (addr_eq(old, new))
		return 0;
	__s64 d = csum_diff16(old, new);
	if (d < 0 || bpf_l4_csum_replace(skb, icsum, 0, d, pseudo) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, (void *)new, 16, 0);
}

/* icmp_flow finds the north-south flow an ICMP error quotes: the quote
 * (src:sport -> dst:dport) is node:snat_port -> backend (ingress, SNATed
 * flows) or client -> backend (egress, DNAT-only flows), so the flow's
 * reply direction is dst:dport -> src:sport. */
static __always_inline struct np_ct *icmp_flow(const __u8 *src, __be16 sport, const __u8 *dst, __be16 dport,
					       __u8 proto, __u64 now, int egress)
{
	struct np_ct_key k;
	ct_key(&k, dst, dport, src, sport, proto, NP_CT_REPLY);
	struct np_ct *ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (!ct && egress) {
		/* As for replies: the quote's backend side may have been
		 * masqueraded by the node's netfilter; find it by its client. */
		ct_key(&k, 0, 0, src, sport, proto, NP_CT_CLIENT);
		ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	}
	if (!ct || !(ct->flags & NP_CT_F_SNAT) != !!egress || ct->expires_ns <= now)
		return 0;
	return ct;
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
	__u8 qs[16], qd[16];
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
	mapped4(qs, in.saddr);
	mapped4(qd, in.daddr);
	struct np_ct *ct = icmp_flow(qs, ports[0], qd, ports[1], in.protocol, now, egress);
	if (!ct)
		return TCX_NEXT;
	__be32 client = W(ct->addr, 3), front = W(ct->nat, 3);
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
	__be32 osrc = W(p->saddr, 3), odst = W(p->daddr, 3);
	if (bpf_l3_csum_replace(skb, IP_CSUM_OFF, osrc, front, 4) < 0 ||
	    bpf_skb_store_bytes(skb, IP_SRC_OFF, &front, 4, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, odst, client, 4) < 0 ||
	    bpf_skb_store_bytes(skb, IP_DST_OFF, &client, 4, 0) < 0)
		return TC_ACT_SHOT;
	stat(NP_STAT_ICMP_ERROR);
	if (egress)
		return TCX_NEXT;
	struct bpf_fib_lookup f;
	mapped4(qs, front);
	mapped4(qd, client);
	int rc = fib(skb, CTX_TC, p, qs, qd, &f);
	return forward(skb, CTX_TC, p, rc, &f);
}

/* icmp6_error is icmp_error for ICMPv6 (destination unreachable, packet
 * too big, time exceeded, parameter problem), quoting an IPv6 header
 * without extension headers. ICMPv6's checksum covers a pseudo-header:
 * the outer addresses change it as they change a TCP checksum. */
static __always_inline int icmp6_error(struct __sk_buff *skb, const struct pkt *p, __u64 now, int egress)
{
	__u8 type;
	struct ipv6hdr in;
	__be16 ports[2];
	int icsum = p->l4_off + 2, ioff = p->l4_off + ICMP_HLEN;

	if (bpf_skb_load_bytes(skb, p->l4_off, &type, 1) < 0)
		return TCX_NEXT;
	if (type < ICMPV6_DEST_UNREACH_ || type > ICMPV6_PARAMPROB_)
		return TCX_NEXT;
	if (bpf_skb_load_bytes(skb, ioff, &in, sizeof(in)) < 0 ||
	    (in.nexthdr != IPPROTO_TCP && in.nexthdr != IPPROTO_UDP))
		return TCX_NEXT;
	if (bpf_skb_load_bytes(skb, ioff + sizeof(in), ports, sizeof(ports)) < 0)
		return TCX_NEXT;
	struct np_ct *ct = icmp_flow((__u8 *)&in.saddr, ports[0], (__u8 *)&in.daddr, ports[1], in.nexthdr, now, egress);
	if (!ct)
		return TCX_NEXT;
	const __u8 *client = ct->addr, *front = ct->nat;
	__be16 cport = ct->port, fport = ct->nat_port;

	/* The quote: node (or client) -> client, backend -> frontend. */
	if (icmp6_store16(skb, icsum, ioff + offsetof(struct ipv6hdr, saddr), (__u8 *)&in.saddr, client, 0) < 0 ||
	    icmp6_store16(skb, icsum, ioff + offsetof(struct ipv6hdr, daddr), (__u8 *)&in.daddr, front, 0) < 0 ||
	    icmp_store(skb, icsum, ioff + sizeof(in), ports[0], cport, 2) < 0 ||
	    icmp_store(skb, icsum, ioff + sizeof(in) + 2, ports[1], fport, 2) < 0)
		return TC_ACT_SHOT;
	/* The outer header: frontend -> client. */
	if (icmp6_store16(skb, icsum, IP6_SRC_OFF, p->saddr, front, BPF_F_PSEUDO_HDR) < 0 ||
	    icmp6_store16(skb, icsum, IP6_DST_OFF, p->daddr, client, BPF_F_PSEUDO_HDR) < 0)
		return TC_ACT_SHOT;
	stat(NP_STAT_ICMP_ERROR);
	if (egress)
		return TCX_NEXT;
	struct bpf_fib_lookup f;
	int rc = fib(skb, CTX_TC, p, front, client, &f);
	return forward(skb, CTX_TC, p, rc, &f);
}

/* Direct server return (--bpf-lb-mode dsr or hybrid; bpf/README.md).
 *
 * The entry node forwards a new flow to a remote backend with the client's
 * address and port kept and only the destination translated, and tells the
 * backend's node the frontend in an IPv4 option (NP_DSR_OPT4_*) or an IPv6
 * destination-options header (struct np_dsr_opt6) on the
 * packets that need it: a TCP flow's SYNs, every UDP datagram. The
 * backend's node (its ingress program) records the flow as a DNAT-only
 * reply entry, strips the option and hands the packet to its stack; its
 * egress program then gives the backend's replies the frontend's address
 * and port, and they go straight to the client. */

/* dsr_mode: whether new flows of this packet's protocol to a remote
 * backend are dispatched DSR. */
static __always_inline int dsr_mode(const struct pkt *p)
{
	__u32 zero = 0;
	__u32 *m = bpf_map_lookup_elem(&waggle_np_lb_mode, &zero);
	if (!m)
		return 0;
	return *m == NP_LB_MODE_DSR || (*m == NP_LB_MODE_HYBRID && p->proto == IPPROTO_TCP);
}

/* dsr_needs_opt: the packets of a DSR flow that carry the option. A TCP
 * flow needs it on its SYN only (retransmitted SYNs too): the backend's
 * node has recorded the flow when the backend answers, and a SYN has no
 * payload, so the 8 bytes never push it over the MTU. UDP has no
 * handshake: every datagram carries it (as Cilium's), which also refreshes
 * the backend node's entry when the backend is silent. */
static __always_inline int dsr_needs_opt(const struct pkt *p)
{
	return p->proto == IPPROTO_UDP || (p->tcp_flags & 0x02);
}

/* dsr_room: the option can be inserted — a whole (unfragmented, not GSO)
 * packet without IPv4 options or IPv6 extension headers, which stays
 * within the egress device's MTU 8 (IPv6: 24) bytes longer. */
static __always_inline int dsr_room(struct __sk_buff *skb, const struct pkt *p, __u32 ifindex)
{
	__u32 mtu = 0;
	if (p->frag || skb->gso_segs > 1)
		return 0;
	if (p->v6)
		return p->l4_off == ETH_HLEN + sizeof(struct ipv6hdr) &&
		       bpf_check_mtu(skb, ifindex, &mtu, sizeof(struct np_dsr_opt6), 0) == BPF_MTU_CHK_RET_SUCCESS;
	return p->l4_off == ETH_HLEN + sizeof(struct iphdr) &&
	       bpf_check_mtu(skb, ifindex, &mtu, NP_DSR_OPT4_LEN, 0) == BPF_MTU_CHK_RET_SUCCESS;
}

#define IP6_NEXTHDR_OFF (ETH_HLEN + offsetof(struct ipv6hdr, nexthdr))
#define IP6_PLEN_OFF (ETH_HLEN + offsetof(struct ipv6hdr, payload_len))

/* dsr_add_opt6 inserts the DSR destination-options header after the IPv6
 * header (no extension headers before it: dsr_room): next header 60,
 * payload length + 24. IPv6 has no header checksum, and the L4
 * pseudo-header's length counts only the upper-layer packet. */
static __always_inline int dsr_add_opt6(struct __sk_buff *skb, const struct pkt *p)
{
	struct np_dsr_opt6 o = {.nexthdr = p->proto, .hdrlen = 2, .type = NP_DSR_OPT6_TYPE, .len = NP_DSR_OPT6_LEN};
	__u8 nh = NEXTHDR_DEST_;
	__be16 plen = bpf_htons(p->tot_len - sizeof(struct ipv6hdr) + sizeof(o));

	addr_copy(o.addr, p->daddr);
	o.port = p->dport;
	if (bpf_skb_adjust_room(skb, sizeof(o), BPF_ADJ_ROOM_NET, 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &o, sizeof(o), 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP6_NEXTHDR_OFF, &nh, 1, 0) < 0 ||
	    bpf_skb_store_bytes(skb, IP6_PLEN_OFF, &plen, 2, 0) < 0)
		return -1;
	stat(NP_STAT_DSR_OPT);
	return 0;
}

/* dsr_add_opt inserts the DSR option naming the frontend (the packet's
 * destination as it arrived) after the IPv4 header: ihl 5 -> 7, total
 * length + 8, the header checksum updated by the difference. L4 checksums
 * do not cover IP options (nor does CHECKSUM_PARTIAL's csum_start move:
 * bpf_skb_adjust_room moves the headers before it). */
static __always_inline int dsr_add_opt(struct __sk_buff *skb, const struct pkt *p)
{
	if (p->v6)
		return dsr_add_opt6(skb, p);
	__u32 w0, nw[3];
	__u8 *b = (__u8 *)nw;
	__be16 tl = bpf_htons(p->tot_len + NP_DSR_OPT4_LEN);
	__be32 front = W(p->daddr, 3);

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &w0, sizeof(w0)) < 0)
		return -1;
	nw[0] = w0;
	b[0] = 0x47; /* version 4, ihl 7 */
	__builtin_memcpy(b + 2, &tl, 2);
	b[4] = NP_DSR_OPT4_TYPE;
	b[5] = NP_DSR_OPT4_LEN;
	__builtin_memcpy(b + 6, &p->dport, 2);
	__builtin_memcpy(b + 8, &front, 4);
	__s64 d = bpf_csum_diff(&w0, sizeof(w0), nw, sizeof(nw), 0);
	if (d < 0 || bpf_skb_adjust_room(skb, NP_DSR_OPT4_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, nw, 4, 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + sizeof(struct iphdr), &nw[1], NP_DSR_OPT4_LEN, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_CSUM_OFF, 0, d, 0) < 0)
		return -1;
	stat(NP_STAT_DSR_OPT);
	return 0;
}

/* dsr_recv is the backend node's side: a packet (client -> backend) with
 * the DSR option. The flow is recorded as a DNAT-only flow of this node
 * (REPLY: backend -> client restores the frontend as source, NP_CT_F_DSR;
 * ORIGINAL: the client's direction, NP_CT_F_DSR_RECV, see dsr_track), the
 * option is stripped, and the stack delivers the packet to the backend. */
static __always_inline int dsr_recv(struct __sk_buff *skb, const struct pkt *p)
{
	struct np_ct_key k;
	struct np_ct nv;
	__u64 now = bpf_ktime_get_ns();
	__u32 old[3], nw;
	__u8 *b = (__u8 *)&nw;
	__be16 tl = bpf_htons(p->tot_len - NP_DSR_OPT4_LEN);

	__builtin_memset(&nv, 0, sizeof(nv));
	nv.created_ns = now;
	nv.flags = NP_CT_F_DSR | closing(p);
	nv.expires_ns = now + lifetime(p, nv.flags);
	nv.packets = 1;
	addr_copy(nv.addr, p->saddr);
	nv.port = p->sport;
	addr_copy(nv.nat, p->dsr_addr);
	nv.nat_port = p->dsr_port;
	ct_key(&k, p->daddr, p->dport, p->saddr, p->sport, p->proto, NP_CT_REPLY);
	struct np_ct *ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (ct && (ct->flags & NP_CT_F_DSR) && ct->nat_port == nv.nat_port && addr_eq(ct->nat, nv.nat) &&
	    ct->expires_ns > now && !(p->tcp_flags & 0x02)) {
		/* the same flow's next datagram: keep its state, refresh it */
		if (ct->expires_ns < nv.expires_ns)
			ct->expires_ns = nv.expires_ns;
		ct->packets++;
	} else {
		bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY);
	}
	/* No CLIENT entry (unlike a flow DNATed here): the stack sees this
	 * packet, so the backend's reply is part of a connection its
	 * netfilter knows and is never masqueraded — and a CLIENT entry,
	 * keyed by the client alone, would rewrite the replies of another
	 * backend to the same client port. */
	/* The client's direction, as its packets arrive here (dsr_track). */
	ct_key(&k, p->saddr, p->sport, p->daddr, p->dport, p->proto, NP_CT_ORIGINAL);
	ct = bpf_map_lookup_elem(&waggle_np_ct, &k);
	if (ct && (ct->flags & NP_CT_F_DSR_RECV) && ct->expires_ns > now && !(p->tcp_flags & 0x02)) {
		if (ct->expires_ns < nv.expires_ns)
			ct->expires_ns = nv.expires_ns;
		ct->packets++;
	} else {
		nv.flags |= NP_CT_F_DSR_RECV;
		addr_copy(nv.addr, p->daddr);
		nv.port = p->dport;
		bpf_map_update_elem(&waggle_np_ct, &k, &nv, BPF_ANY);
	}

	if (p->v6) {
		/* Strip: the header's next header back, payload length - 24. */
		__u8 nh;
		__be16 plen = bpf_htons(p->tot_len - sizeof(struct ipv6hdr) - sizeof(struct np_dsr_opt6));
		if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct ipv6hdr), &nh, 1) < 0 ||
		    bpf_skb_store_bytes(skb, IP6_NEXTHDR_OFF, &nh, 1, 0) < 0 ||
		    bpf_skb_store_bytes(skb, IP6_PLEN_OFF, &plen, 2, 0) < 0 ||
		    bpf_skb_adjust_room(skb, -(int)sizeof(struct np_dsr_opt6), BPF_ADJ_ROOM_NET, 0) < 0)
			return TC_ACT_SHOT;
		stat(NP_STAT_DSR_RECV);
		return TCX_NEXT;
	}
	/* Strip: the header checksum loses the option's words and the first
	 * word's change (ihl 7 -> 5, total length - 8). */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &old[0], 4) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(struct iphdr), &old[1], NP_DSR_OPT4_LEN) < 0)
		return TC_ACT_SHOT;
	nw = old[0];
	b[0] = 0x45;
	__builtin_memcpy(b + 2, &tl, 2);
	__s64 d = bpf_csum_diff(old, sizeof(old), &nw, sizeof(nw), 0);
	if (d < 0 || bpf_l3_csum_replace(skb, IP_CSUM_OFF, 0, d, 0) < 0 ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &nw, sizeof(nw), 0) < 0 ||
	    bpf_skb_adjust_room(skb, -NP_DSR_OPT4_LEN, BPF_ADJ_ROOM_NET, 0) < 0)
		return TC_ACT_SHOT;
	stat(NP_STAT_DSR_RECV);
	return TCX_NEXT;
}

/* dsr_track follows a DSR flow this node recorded (dsr_recv) through the
 * client's packets that carry no option: they refresh it, the client's
 * ACK marks it answered, its FIN or RST shortens the reply entries (else
 * they would outlive the flow by hours and rewrite the replies of the next
 * connection on the same tuple), and a SYN without the option — a new
 * connection on the same tuple that no entry node dispatched DSR — drops
 * the flow's entries. The packet goes on to the stack either way. */
static __always_inline int dsr_track(const struct pkt *p, struct np_ct *ct, __u64 now)
{
	struct np_ct_key k;
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & 0x12) == 0x02) {
		ct_key(&k, p->daddr, p->dport, p->saddr, p->sport, p->proto, NP_CT_REPLY);
		bpf_map_delete_elem(&waggle_np_ct, &k);
		ct_key(&k, p->saddr, p->sport, p->daddr, p->dport, p->proto, NP_CT_ORIGINAL);
		bpf_map_delete_elem(&waggle_np_ct, &k);
		return TCX_NEXT;
	}
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & 0x12) == 0x10)
		ct->flags |= NP_CT_F_REPLIED;
	ct->flags |= closing(p);
	ct->expires_ns = now + lifetime(p, ct->flags);
	ct->packets++;
	if (closing(p))
		close_other(p->daddr, p->dport, p->saddr, p->sport, NP_CT_REPLY, p, now);
	return TCX_NEXT;
}

/* np_ingress is the ingress of an external device, in tc (xdp = CTX_TC)
 * or XDP (CTX_XDP). Both make the same decisions from the same maps; XDP
 * returns XDP_PASS, before changing any state, for whatever it leaves to tc
 * (see xdp_fwd_ok, and frames not unicast to the device, fragments, ICMP,
 * IPv6 extension headers, offloaded checksums, TTL 1),
 * which then handles the packet as if XDP were not there. Counters XDP would
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
	 * one flow while both are up). Broadcast and multicast frames are no
	 * north-south flow's either. XDP has no pkt_type: it compares the
	 * destination with the device's MAC (np_device.mac) and passes every
	 * other frame on to tc, which counts it here (bpf/README.md). */
	if (xdp && !xdp_for_device(ctx))
		return XDP_PASS;
	if (!xdp && ((struct __sk_buff *)ctx)->pkt_type != PACKET_HOST) {
		if (((struct __sk_buff *)ctx)->pkt_type == PACKET_OTHERHOST)
			stat(NP_STAT_OTHER_HOST);
		return TCX_NEXT;
	}

	r = parse(ctx, xdp, &p);
	if (r < 0)
		return xdp ? XDP_PASS : TCX_NEXT;
	if (r == 1 || r == 3) {
		if (xdp)
			return XDP_PASS; /* tc counts it */
		stat(r == 1 ? NP_STAT_FRAGMENT : NP_STAT_IPV6_EXTHDR);
		return TCX_NEXT;
	}
	if (xdp && p.frag)
		return XDP_PASS; /* fragments are translated in tc (waggle_np_frag) */
	if (r == 2) {
		if (xdp)
			return XDP_PASS; /* ICMP errors are translated in tc */
		if (p.v6)
			return icmp6_error(ctx, &p, bpf_ktime_get_ns(), 0);
		return icmp_error(ctx, &p, bpf_ktime_get_ns(), 0);
	}
	if (p.dsr) {
		if (xdp)
			return XDP_PASS; /* tc strips the option (bpf_skb_adjust_room) */
		return dsr_recv(ctx, &p);
	}
	if (xdp) {
		__u16 check;
		if (p.ttl <= 1 || ctx_load(ctx, xdp, csum_off(&p), &check, 2) < 0)
			return XDP_PASS;
		__u16 l4len = p.tot_len - (p.l4_off - ETH_HLEN);
		if (p.v6 ? csum_is_seed6(check, p.saddr, p.daddr, p.proto, l4len)
			 : csum_is_seed(check, W(p.saddr, 3), W(p.daddr, 3), p.proto, l4len)) {
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
	if (ct && (ct->flags & NP_CT_F_DSR_RECV)) {
		if (xdp)
			return XDP_PASS; /* tc follows the flow */
		return dsr_track(&p, ct, now);
	}
	if (ct && ct->expires_ns > now && p.proto == IPPROTO_TCP && (p.tcp_flags & 0x12) == 0x02 &&
	    (ct->flags & NP_CT_F_CLOSING) && !reopen(ct, &p, now))
		ct = 0; /* a new flow on a closed flow's tuple */
	if (ct && ct->expires_ns > now) {
		struct lb_backend *be = bpf_map_lookup_elem(&waggle_backends, &ct->backend_id);
		if (be && !backend_free(be) && be->port == ct->port && addr_eq(be->addr, ct->addr)) {
			const __u8 *baddr = ct->addr, *saddr = p.saddr;
			__be16 bport = ct->port, sport = p.sport;
			int opt = (ct->flags & NP_CT_F_DSR) && dsr_needs_opt(&p);
			if (xdp && opt)
				return XDP_PASS; /* the option is inserted in tc */
			rc = fib(ctx, xdp, &p, p.saddr, baddr, &f);
			if (xdp && !xdp_fwd_ok(rc, &f))
				return XDP_PASS;
			if (ct->flags & NP_CT_F_SNAT) {
				saddr = ct->nat;
				sport = ct->nat_port;
			}
			ct->flags |= closing(&p);
			/* DSR: this node never sees the backend's answer; the
			 * client's ACK of it (an ACK without SYN) proves it. */
			if ((ct->flags & NP_CT_F_DSR) && p.proto == IPPROTO_TCP && (p.tcp_flags & 0x12) == 0x10)
				ct->flags |= NP_CT_F_REPLIED;
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
			if (!xdp && opt) {
				/* A datagram too big for the option goes without it: the
				 * backend's node has the flow from earlier ones. */
				if (!dsr_room(ctx, &p, f.ifindex))
					stat(NP_STAT_DSR_MTU);
				else if (dsr_add_opt(ctx, &p) < 0)
					return TC_ACT_SHOT;
			}
			return forward(ctx, xdp, &p, rc, &f);
		}
		if (xdp)
			pend |= 1 << NP_STAT_BACKEND_GONE;
		else
			stat(NP_STAT_BACKEND_GONE);
	}

	/* A later fragment only continues the flow its first fragment
	 * started (or found): it is never a new flow. */
	if (p.frag == FRAG_LATER) {
		stat(NP_STAT_FRAGMENT);
		return xdp ? XDP_PASS : TCX_NEXT;
	}

	/* A new flow to a north-south frontend? */
	struct lb_service_key sk = {};
	addr_copy(sk.addr, p.daddr);
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
		addr_copy(rk.addr, p.saddr);
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
		addr_copy(ak.client, p.saddr);
		ak.rev_nat_id = id;
		struct np_affinity *a = bpf_map_lookup_elem(&waggle_np_affinity, &ak);
		struct lb_backend *ab = a ? bpf_map_lookup_elem(&waggle_backends, &a->backend_id) : 0;
		/* The backend the entry was written for: same ID, same generation
		 * (IDs are reused). */
		if (a && ab && now - a->last_used_ns <= (__u64)svc->affinity_timeout * NSEC && !backend_free(ab) &&
		    ab->gen == a->backend_gen) {
			be_id = a->backend_id;
			a->last_used_ns = now;
			if (xdp)
				pend |= 1 << NP_STAT_AFFINITY_HIT;
			else
				stat(NP_STAT_AFFINITY_HIT);
		}
		/* the client alone: every node agrees */
		h = fmix(addr_mix(0x5741474c, p.saddr, IS6(xdp, &p)));
	} else {
		h = flow_hash(&p, xdp);
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
			if (svc->count <= LB_INLINE_BACKENDS) {
				be_id = svc->backends[(sk.slot - 1) & (LB_INLINE_BACKENDS - 1)];
			} else {
				struct lb_service *slot = bpf_map_lookup_elem(&waggle_services, &sk);
				if (!slot)
					return xdp ? XDP_PASS : TCX_NEXT;
				be_id = slot->backend_id;
			}
		}
		new_affinity = svc->flags & SVC_FLAG_AFFINITY;
	}
	struct lb_backend *be = bpf_map_lookup_elem(&waggle_backends, &be_id);
	/* The backend is of the frontend's family (no NAT46/64). */
	if (!be || backend_free(be) || is_mapped4(be->addr) == IS6(xdp, &p))
		return xdp ? XDP_PASS : TCX_NEXT;
	const __u8 *baddr = be->addr, *saddr = p.saddr;
	__u8 snat[16];
	__be16 bport = be->port, sport = p.sport;
	__u8 local = svc->flags & SVC_FLAG_LOCAL;

	rc = fib(ctx, xdp, &p, p.saddr, baddr, &f);
	if (xdp && (local || !xdp_fwd_ok(rc, &f)))
		return XDP_PASS; /* a backend on this node, or no resolved route: tc */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH && rc != BPF_FIB_LKUP_RET_NOT_FWDED) {
		stat(NP_STAT_FIB_MISS);
		return TCX_NEXT;
	}
	struct np_device *dev = 0;
	if (!local && rc != BPF_FIB_LKUP_RET_NOT_FWDED)
		dev = ext_dev(f.ifindex);
	/* A remote backend in DSR mode: tc dispatches it (XDP cannot insert
	 * the option); without room for the option the flow is SNATed. */
	int dsr = dev && dsr_mode(&p);
	if (xdp && dsr)
		return XDP_PASS;
	if (!xdp && dsr && dsr_needs_opt(&p) && !dsr_room(ctx, &p, f.ifindex)) {
		dsr = 0;
		stat(NP_STAT_DSR_MTU);
	}
	if (new_affinity) {
		struct np_affinity av = {.last_used_ns = now, .backend_id = be_id, .backend_gen = be->gen};
		bpf_map_update_elem(&waggle_np_affinity, &ak, &av, BPF_ANY);
	}
	__builtin_memset(&nv, 0, sizeof(nv));
	nv.created_ns = now;
	nv.rev_nat_id = id;
	nv.flags = closing(&p);
	addr_copy(nv.addr, p.saddr);
	nv.port = p.sport;
	addr_copy(nv.nat, p.daddr);
	nv.nat_port = p.dport;
	if (dsr) {
		/* The client's address and port kept; the backend's node
		 * answers the client directly. No reply entries here. */
		nv.flags |= NP_CT_F_DSR;
		nv.expires_ns = now + lifetime(&p, nv.flags);
		stat(NP_STAT_XLATE_DSR);
	} else if (dev && snat_addr(dev, IS6(xdp, &p), snat)) {
		/* Remote backend: the reply must come back here. Find a free
		 * source port of the range for (backend, node address). */
		__u32 range = (__u32)cfg->snat_max - cfg->snat_min + 1;
		int found = 0;
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
	addr_copy(nv.addr, baddr);
	nv.port = bport;
	if (nv.flags & NP_CT_F_SNAT) {
		addr_copy(nv.nat, saddr);
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
	if (!xdp && dsr && dsr_needs_opt(&p) && dsr_add_opt(ctx, &p) < 0)
		return TC_ACT_SHOT;
	return forward(ctx, xdp, &p, rc, &f);
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
	__u32 iif = skb->ingress_ifindex;
	int r;

	/* A packet leaving the device it arrived on — one the ingress program
	 * forwarded (a request to a remote backend, a reply going back to its
	 * client), or one the stack routes back out — is no reply or ICMP
	 * error of a backend on this node: those come from a pod's device or
	 * from the node itself (ingress_ifindex 0). Leave it without a parse
	 * or a conntrack lookup. (Only the same device is checked: a lookup of
	 * the arrival device in waggle_np_devices would cost every local
	 * backend's reply what it saves the rare packet crossing from one
	 * external device to another.) */
	if (iif && iif == skb->ifindex)
		return TCX_NEXT;
	r = parse(skb, CTX_TC, &p);

	if (r == 2) {
		if (p.v6)
			return icmp6_error(skb, &p, bpf_ktime_get_ns(), 1);
		return icmp_error(skb, &p, bpf_ktime_get_ns(), 1);
	}
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
	if (!(ct->flags & NP_CT_F_REPLIED) || closing(&p))
		mark_replied(ct->addr, ct->port, ct->nat, ct->nat_port, p.proto, closing(&p));
	ct->flags |= closing(&p) | NP_CT_F_REPLIED;
	ct->expires_ns = now + lifetime(&p, ct->flags);
	ct->packets++;
	if (closing(&p))
		close_other(ct->addr, ct->port, ct->nat, ct->nat_port, NP_CT_ORIGINAL, &p, now);
	stat(NP_STAT_REPLY);
	if (rewrite(skb, CTX_TC, &p, ct->nat, ct->nat_port, p.daddr, p.dport) < 0)
		return TC_ACT_SHOT;
	return TCX_NEXT;
}
