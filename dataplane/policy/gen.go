package policy

//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror" -target bpfel -type pol_endpoint -type pol_key -type pol_entry -type pol_ip_key -type pol_ip_info -type pol_cidr_key -type pol_ct_key -type pol_ct -type pol_event -type pol_config -type pol_name_key -type pol_name polBPF ../../bpf/policy.c -- -nostdinc -I../../bpf/include -I../../bpf/lib
