/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The socket load balancer's maps. Every map is pinned by name under the
 * loader's pin directory (/sys/fs/bpf/waggle/<node>/<name>) so a restarted
 * proxy, and `waggle bpf`, find them again. Sizes are defaults: the loader
 * sets max_entries from its Config before creating the maps.
 */
#ifndef WAGGLE_MAPS_H
#define WAGGLE_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lb.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_service_key);
	__type(value, struct lb_service);
	__uint(max_entries, LB_SERVICES_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_services SEC(".maps");

/* Indexed by backend ID: max_entries is the backends-map size + 1 (ID 0 is
 * never used). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(max_entries, LB_BACKENDS_MAX + 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_rev_nat);
	__uint(max_entries, LB_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_rev_nat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_reverse_sk_key);
	__type(value, struct lb_reverse_sk);
	__uint(max_entries, LB_REVERSE_SK_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_reverse_sk SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity);
	__uint(max_entries, LB_AFFINITY_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct lb_svc_name);
	__uint(max_entries, LB_REVNAT_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_svc_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct lb_meta);
	__uint(max_entries, 1);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, STAT_MAX);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} waggle_stats SEC(".maps");

#endif /* WAGGLE_MAPS_H */
