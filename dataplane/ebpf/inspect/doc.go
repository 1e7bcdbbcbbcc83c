// Package inspect is `waggle bpf`, the bpftool-style inspection CLI of the
// eBPF dataplane: it reads a node's pinned maps and links (through
// dataplane/ebpf's read-only View) and prints programs, map pressure,
// frontends with their backend slots, affinity and reverse-socket entries,
// raw map dumps, and which backend a connection would reach and why — as
// aligned tables, JSON or YAML, with exit codes scripts can rely on.
//
// It reads only: it never writes a map, attaches a program or talks to the
// proxy or the API server, so it works while the proxy is down. Decoding of
// the map layout belongs to dataplane/ebpf; this package only adds what the
// View leaves raw (the rev_nat and names maps) and the explain logic, which
// mirrors bpf/sock_lb.c's choice of a backend.
package inspect
