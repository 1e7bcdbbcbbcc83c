/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * A small packet-context abstraction, so one function serves a tc program
 * (struct __sk_buff) and an XDP program (struct xdp_md): loads, stores and
 * incremental checksum updates. The hook is a compile-time constant at every
 * call site (CTX_TC or CTX_XDP); with the functions inlined, each branch on
 * it folds away and a program only calls the helpers its hook allows.
 *
 * XDP has no bpf_l3_csum_replace/bpf_l4_csum_replace: ctx_csum_replace
 * does RFC 1624's incremental update by hand. It is only right for a full
 * checksum; a packet whose L4 checksum is left to offload
 * (CHECKSUM_PARTIAL: the field holds the pseudo-header sum, see
 * csum_is_seed) must not be rewritten in XDP.
 */
#ifndef WAGGLE_CTX_H
#define WAGGLE_CTX_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define CTX_TC 0
#define CTX_XDP 1

static __always_inline void *ctx_data(void *ctx, const int xdp)
{
	if (xdp)
		return (void *)(long)((struct xdp_md *)ctx)->data;
	return (void *)(long)((struct __sk_buff *)ctx)->data;
}

static __always_inline void *ctx_data_end(void *ctx, const int xdp)
{
	if (xdp)
		return (void *)(long)((struct xdp_md *)ctx)->data_end;
	return (void *)(long)((struct __sk_buff *)ctx)->data_end;
}

/* The device the packet arrived on. */
static __always_inline __u32 ctx_ifindex(void *ctx, const int xdp)
{
	if (xdp)
		return ((struct xdp_md *)ctx)->ingress_ifindex;
	return ((struct __sk_buff *)ctx)->ifindex;
}

static __always_inline int ctx_load(void *ctx, const int xdp, __u32 off, void *to, __u32 len)
{
	if (xdp)
		return bpf_xdp_load_bytes(ctx, off, to, len);
	return bpf_skb_load_bytes(ctx, off, to, len);
}

static __always_inline int ctx_store(void *ctx, const int xdp, __u32 off, void *from, __u32 len)
{
	if (xdp)
		return bpf_xdp_store_bytes(ctx, off, from, len);
	return bpf_skb_store_bytes(ctx, off, from, len, 0);
}

/* csum_fold16 folds a 32-bit one's-complement sum to 16 bits (not
 * complemented). */
static __always_inline __u16 csum_fold16(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

/* csum_replace returns checksum check after the size-byte (2 or 4) word
 * from becomes to: RFC 1624 eqn. 3, HC' = ~(~HC + ~m + m'). Every value is
 * as loaded from the packet (network order), which one's-complement sums do
 * not care about as long as all are. */
static __always_inline __u16 csum_replace(__u16 check, __u32 from, __u32 to, int size)
{
	__u32 s = (__u16)~check;
	if (size == 4) {
		s += (__u16)~(from & 0xffff);
		s += (__u16)~(from >> 16);
		s += (to & 0xffff) + (to >> 16);
	} else {
		s += (__u16)~from;
		s += to & 0xffff;
	}
	return (__u16)~csum_fold16(s);
}

/* ctx_l3_csum_replace updates the IP header checksum at off. */
static __always_inline int ctx_l3_csum_replace(void *ctx, const int xdp, __u32 off, __u32 from, __u32 to, int size)
{
	__u16 check;
	if (!xdp)
		return bpf_l3_csum_replace(ctx, off, from, to, size);
	if (ctx_load(ctx, xdp, off, &check, 2) < 0)
		return -1;
	check = csum_replace(check, from, to, size);
	return ctx_store(ctx, xdp, off, &check, 2);
}

/* ctx_l4_csum_replace updates a TCP or UDP checksum at off; flags as
 * bpf_l4_csum_replace's: the size (2 or 4), BPF_F_PSEUDO_HDR (a pseudo-header
 * word: part of a full checksum like any other, so XDP ignores it) and
 * BPF_F_MARK_MANGLED_0 (UDP: 0 means "no checksum" and stays 0; a result of
 * 0 is sent as 0xffff). */
static __always_inline int ctx_l4_csum_replace(void *ctx, const int xdp, __u32 off, __u32 from, __u32 to, __u64 flags)
{
	__u16 check;
	if (!xdp)
		return bpf_l4_csum_replace(ctx, off, from, to, flags);
	if (ctx_load(ctx, xdp, off, &check, 2) < 0)
		return -1;
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		return 0;
	check = csum_replace(check, from, to, flags & 0xf);
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		check = 0xffff;
	return ctx_store(ctx, xdp, off, &check, 2);
}

/* ctx_l4_csum_diff applies diff — bpf_csum_diff's sum of the difference
 * between old and new words — to a TCP/UDP checksum at off, as
 * bpf_l4_csum_replace(from 0, to diff) does in tc: HC' = ~(~HC + diff).
 * flags: BPF_F_PSEUDO_HDR when the words are pseudo-header words (the
 * addresses: a checksum left to offload (CHECKSUM_PARTIAL) takes them, and
 * a CHECKSUM_COMPLETE skb's csum follows), not for words of the L4 header
 * itself (the ports: an offloaded checksum covers them when it is
 * completed); BPF_F_MARK_MANGLED_0 as for ctx_l4_csum_replace. XDP sees
 * only full checksums: both kinds of words change it alike. */
static __always_inline int ctx_l4_csum_diff(void *ctx, const int xdp, __u32 off, __u32 diff, __u64 flags)
{
	__u16 check;
	if (!xdp)
		return bpf_l4_csum_replace(ctx, off, 0, diff, flags & (BPF_F_PSEUDO_HDR | BPF_F_MARK_MANGLED_0));
	if (ctx_load(ctx, xdp, off, &check, 2) < 0)
		return -1;
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		return 0;
	check = (__u16)~csum_fold16((__u32)(__u16)~check + (diff & 0xffff) + (diff >> 16));
	if ((flags & BPF_F_MARK_MANGLED_0) && check == 0)
		check = 0xffff;
	return ctx_store(ctx, xdp, off, &check, 2);
}

/* ctx_l3_csum_diff applies diff (as ctx_l4_csum_diff) to the IPv4 header
 * checksum at off: bpf_l3_csum_replace(from 0, to diff) in tc. */
static __always_inline int ctx_l3_csum_diff(void *ctx, const int xdp, __u32 off, __u32 diff)
{
	__u16 check;
	if (!xdp)
		return bpf_l3_csum_replace(ctx, off, 0, diff, 0);
	if (ctx_load(ctx, xdp, off, &check, 2) < 0)
		return -1;
	check = (__u16)~csum_fold16((__u32)(__u16)~check + (diff & 0xffff) + (diff >> 16));
	return ctx_store(ctx, xdp, off, &check, 2);
}

/* csum_is_seed reports whether a TCP/UDP checksum field holds only the
 * pseudo-header sum (saddr, daddr, protocol, L4 length; folded, not
 * complemented): what a sender whose checksum is offloaded writes
 * (CHECKSUM_PARTIAL; packets from a local veth or tap). Such a packet must
 * be rewritten by tc, whose helpers know; a full checksum equals the seed
 * by chance once in 65,536 packets, which then take the tc path too. */
static __always_inline int csum_is_seed(__u16 check, __u32 saddr, __u32 daddr, __u8 proto, __u16 l4_len)
{
	__u32 s = (saddr & 0xffff) + (saddr >> 16) + (daddr & 0xffff) + (daddr >> 16);
	s += bpf_htons((__u16)proto) + bpf_htons(l4_len);
	return check == csum_fold16(s);
}

#endif /* WAGGLE_CTX_H */
