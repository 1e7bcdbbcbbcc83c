//go:build ignore

/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Waggle's socket-level service load balancer: cgroup sock_addr hooks that
 * rewrite a socket's destination from a Service frontend to one of its
 * backends at connect() (TCP, connected UDP) or sendmsg() (unconnected UDP)
 * time, and show the frontend again to recvmsg() and getpeername(). Nothing
 * is translated per packet. bpf/README.md describes every hook and map.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb.h"
#include "maps.h"

#define ECONNREFUSED 111
#define EADDRINUSE 98

#define SYS_REJECT 0
#define SYS_PROCEED 1

char __license[] SEC("license") = "Dual BSD/GPL";

static __always_inline void stat_inc(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&waggle_stats, &idx);

	if (v)
		*v += 1;
}

/* addr_from_ctx4 writes ip4 as an IPv4-mapped IPv6 address. */
static __always_inline void addr_from_ctx4(__u8 *addr, __u32 ip4)
{
	__u32 *w = (__u32 *)addr;

	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = ip4;
}

static __always_inline void addr_from_ctx6(__u8 *addr, struct bpf_sock_addr *ctx)
{
	__u32 *w = (__u32 *)addr;

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
}

static __always_inline int addr_is_v4mapped(const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;

	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void addr_to_ctx6(struct bpf_sock_addr *ctx, const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;

	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
}

static __always_inline int addr_equal(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline __u32 addr_v4(const __u8 *addr)
{
	return ((const __u32 *)addr)[3];
}

static __always_inline int refuse(__u32 stat, int err)
{
	stat_inc(stat);
	bpf_set_retval(-err);
	return SYS_REJECT;
}

/*
 * pick_slot: TCP gets a fresh random slot per connect; UDP a slot derived
 * from the socket cookie, so one socket keeps one backend across datagrams
 * while different sockets spread evenly.
 */
static __always_inline __u16 pick_slot(struct bpf_sock_addr *ctx, __u16 count)
{
	__u32 r;

	if (ctx->protocol == IPPROTO_TCP) {
		r = bpf_get_prandom_u32();
	} else {
		__u64 c = bpf_get_socket_cookie(ctx) * 0x9E3779B97F4A7C15ULL;

		r = (__u32)(c >> 32);
	}
	return (__u16)(r % count) + 1;
}

/*
 * affinity_backend returns the sticky backend of this client, or 0. The
 * entry's backend must still be the one it was written for: the same ID
 * and generation (IDs are reused).
 */
static __always_inline __u32 affinity_backend(struct bpf_sock_addr *ctx, const struct lb_service *svc)
{
	struct lb_affinity_key k = {
		.netns_cookie = bpf_get_netns_cookie(ctx),
		.rev_nat_id = svc->rev_nat_id,
	};
	struct lb_affinity *a = bpf_map_lookup_elem(&waggle_affinity, &k);
	__u64 now = bpf_ktime_get_ns();

	if (!a)
		return 0;
	if (now - a->last_used_ns > (__u64)svc->affinity_timeout * 1000000000ULL) {
		bpf_map_delete_elem(&waggle_affinity, &k);
		return 0;
	}
	__u32 id = a->backend_id;
	struct lb_backend *be = bpf_map_lookup_elem(&waggle_backends, &id);

	if (!be || backend_free(be) || be->gen != a->backend_gen)
		return 0; /* rewritten below with the new choice */
	a->last_used_ns = now;
	return id;
}

static __always_inline void affinity_update(struct bpf_sock_addr *ctx, const struct lb_service *svc, __u32 backend_id,
					    __u32 gen)
{
	struct lb_affinity_key k = {
		.netns_cookie = bpf_get_netns_cookie(ctx),
		.rev_nat_id = svc->rev_nat_id,
	};
	struct lb_affinity v = {
		.last_used_ns = bpf_ktime_get_ns(),
		.backend_id = backend_id,
		.backend_gen = gen,
	};

	bpf_map_update_elem(&waggle_affinity, &k, &v, BPF_ANY);
}

/*
 * xlate_fwd translates the destination in ctx when it is a frontend.
 * Returns SYS_PROCEED (translated or not a frontend) or SYS_REJECT with the
 * errno set through bpf_set_retval.
 */
static __always_inline int xlate_fwd(struct bpf_sock_addr *ctx, int v6, __u32 stat_ok, __u32 stat_refused)
{
	struct lb_service_key key = {};
	struct lb_service *svc, *slot;
	struct lb_backend *be;
	struct lb_reverse_sk *old;
	__u32 backend_id = 0;
	__u8 proto = (__u8)ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	if (v6)
		addr_from_ctx6(key.addr, ctx);
	else
		addr_from_ctx4(key.addr, ctx->user_ip4);
	key.port = (__be16)ctx->user_port;
	key.proto = proto;
	key.slot = 0;

	svc = bpf_map_lookup_elem(&waggle_services, &key);
	if (!svc)
		return SYS_PROCEED;
	if (svc->count == 0)
		return refuse(stat_refused, ECONNREFUSED);

	if (svc->flags & SVC_FLAG_AFFINITY) {
		backend_id = affinity_backend(ctx, svc);
		if (backend_id)
			stat_inc(STAT_AFFINITY_HIT);
	}
	if (!backend_id) {
		key.slot = pick_slot(ctx, svc->count);
		if (svc->count <= LB_INLINE_BACKENDS) {
			/* The master entry holds the backends: no second lookup. */
			backend_id = svc->backends[(key.slot - 1) & (LB_INLINE_BACKENDS - 1)];
		} else {
			slot = bpf_map_lookup_elem(&waggle_services, &key);
			if (!slot)
				return refuse(STAT_BACKEND_MISSING, ECONNREFUSED);
			backend_id = slot->backend_id;
		}
	}
	be = bpf_map_lookup_elem(&waggle_backends, &backend_id);
	if (!be || backend_free(be))
		return refuse(STAT_BACKEND_MISSING, ECONNREFUSED);
	if (!v6 && !addr_is_v4mapped(be->addr))
		return refuse(STAT_BACKEND_MISSING, ECONNREFUSED);
	if (svc->flags & SVC_FLAG_AFFINITY)
		affinity_update(ctx, svc, backend_id, be->gen);

	/* Remember the frontend for recvmsg/getpeername before rewriting. */
	struct lb_reverse_sk_key rk = {
		.cookie = bpf_get_socket_cookie(ctx),
		.port = be->port,
	};
	struct lb_reverse_sk rv = {
		.port = key.port,
		.rev_nat_id = svc->rev_nat_id,
	};
	__builtin_memcpy(rk.addr, be->addr, 16);
	__builtin_memcpy(rv.addr, key.addr, 16);
	/* Unconnected UDP comes here per datagram: write only what changed. */
	old = bpf_map_lookup_elem(&waggle_reverse_sk, &rk);
	if (!old || old->rev_nat_id != rv.rev_nat_id || old->port != rv.port || !addr_equal(old->addr, rv.addr))
		bpf_map_update_elem(&waggle_reverse_sk, &rk, &rv, BPF_ANY);

	if (v6)
		addr_to_ctx6(ctx, be->addr);
	else
		ctx->user_ip4 = addr_v4(be->addr);
	ctx->user_port = be->port;
	stat_inc(stat_ok);
	return SYS_PROCEED;
}

/* xlate_rev shows the frontend instead of the backend a socket talks to. */
static __always_inline int xlate_rev(struct bpf_sock_addr *ctx, int v6, __u32 stat_ok)
{
	struct lb_reverse_sk_key rk = {};
	struct lb_reverse_sk *rv;
	struct lb_rev_nat *rn;

	rk.cookie = bpf_get_socket_cookie(ctx);
	if (v6)
		addr_from_ctx6(rk.addr, ctx);
	else
		addr_from_ctx4(rk.addr, ctx->user_ip4);
	rk.port = (__be16)ctx->user_port;

	rv = bpf_map_lookup_elem(&waggle_reverse_sk, &rk);
	if (!rv)
		return SYS_PROCEED;
	rn = bpf_map_lookup_elem(&waggle_rev_nat, &rv->rev_nat_id);
	/* The service is gone or its ID reused for another frontend. */
	if (!rn || rn->port != rv->port || !addr_equal(rn->addr, rv->addr)) {
		bpf_map_delete_elem(&waggle_reverse_sk, &rk);
		return SYS_PROCEED;
	}
	if (v6)
		addr_to_ctx6(ctx, rv->addr);
	else
		ctx->user_ip4 = addr_v4(rv->addr);
	ctx->user_port = rv->port;
	stat_inc(stat_ok);
	return SYS_PROCEED;
}

/* bind_guard refuses binding a socket onto a frontend address and port. */
static __always_inline int bind_guard(struct bpf_sock_addr *ctx, int v6)
{
	struct lb_service_key key = {};
	__u8 proto = (__u8)ctx->protocol;

	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return SYS_PROCEED;
	if (v6)
		addr_from_ctx6(key.addr, ctx);
	else
		addr_from_ctx4(key.addr, ctx->user_ip4);
	key.port = (__be16)ctx->user_port;
	key.proto = proto;
	if (key.port == 0 || !bpf_map_lookup_elem(&waggle_services, &key))
		return SYS_PROCEED;
	return refuse(STAT_BIND_REFUSED, EADDRINUSE);
}

SEC("cgroup/connect4")
int waggle_connect4(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 0, STAT_CONNECT_XLATE, STAT_CONNECT_REFUSED);
}

SEC("cgroup/connect6")
int waggle_connect6(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 1, STAT_CONNECT_XLATE, STAT_CONNECT_REFUSED);
}

SEC("cgroup/sendmsg4")
int waggle_sendmsg4(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 0, STAT_SENDMSG_XLATE, STAT_SENDMSG_REFUSED);
}

SEC("cgroup/sendmsg6")
int waggle_sendmsg6(struct bpf_sock_addr *ctx)
{
	return xlate_fwd(ctx, 1, STAT_SENDMSG_XLATE, STAT_SENDMSG_REFUSED);
}

SEC("cgroup/recvmsg4")
int waggle_recvmsg4(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 0, STAT_RECVMSG_XLATE);
}

SEC("cgroup/recvmsg6")
int waggle_recvmsg6(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 1, STAT_RECVMSG_XLATE);
}

SEC("cgroup/getpeername4")
int waggle_getpeername4(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 0, STAT_PEERNAME_XLATE);
}

SEC("cgroup/getpeername6")
int waggle_getpeername6(struct bpf_sock_addr *ctx)
{
	return xlate_rev(ctx, 1, STAT_PEERNAME_XLATE);
}

SEC("cgroup/bind4")
int waggle_bind4(struct bpf_sock_addr *ctx)
{
	return bind_guard(ctx, 0);
}

SEC("cgroup/bind6")
int waggle_bind6(struct bpf_sock_addr *ctx)
{
	return bind_guard(ctx, 1);
}
