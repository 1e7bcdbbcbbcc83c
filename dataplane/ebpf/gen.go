package ebpf

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type lb_service_key -type lb_service -type lb_backend -type lb_rev_nat -type lb_reverse_sk_key -type lb_reverse_sk -type lb_affinity_key -type lb_affinity -type lb_meta -type lb_svc_name sockLB ../../bpf/sock_lb.c -- -nostdinc -I../../bpf/include -I../../bpf/lib

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type np_ct_key -type np_ct -type np_affinity_key -type np_affinity -type np_device -type np_config -type np_svc -type np_maglev_key -type np_maglev_chunk -type np_src_range_key -type np_frag_key -type np_frag nodePort ../../bpf/nodeport.c -- -nostdinc -I../../bpf/include -I../../bpf/lib
