package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

func human(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// print writes the report as a table.
func (r *Report) print(cfg Config, paths []string) {
	w := cfg.Out
	fmt.Fprintf(w, "waggle bench dataplane — kernel %s, %d CPUs, %d clients, %d backends, %d-byte echo, %d rounds × %s (interleaved), median [min–max] per second\n",
		r.Kernel, r.CPUs, r.Clients, r.Backends, r.Payload, r.Rounds, r.Duration)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  · %s\n", n)
	}
	for p, why := range r.Skipped {
		fmt.Fprintf(w, "  · path %s skipped: %s\n", p, why)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| services | test |")
	for _, p := range paths {
		fmt.Fprintf(w, " %s |", p)
	}
	fmt.Fprintf(w, "\n|---|---|%s\n", strings.Repeat("---|", len(paths)))
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s |", human(float64(row.Services)), row.Test)
		for _, p := range paths {
			s := row.Paths[p]
			if s == nil {
				fmt.Fprintf(w, " – |")
				continue
			}
			errs := ""
			if s.Errors > 0 {
				errs = fmt.Sprintf(" (%d errors)", s.Errors)
			}
			if p == "direct" {
				fmt.Fprintf(w, " %s [%s–%s]%s |", human(s.Median), human(s.Min), human(s.Max), errs)
			} else {
				fmt.Fprintf(w, " %s (%.2f×) [%s–%s]%s |", human(s.Median), s.Ratio, human(s.Min), human(s.Max), errs)
			}
		}
		fmt.Fprintln(w)
	}
	printErrors(w, r.Rows)
	if r.Program != nil {
		fmt.Fprintf(w, "\neBPF: programming %s from scratch: median %.3f s [%.3f–%.3f] over %d rounds\n",
			r.ProgramSize, r.Program.Median, r.Program.Min, r.Program.Max, len(r.Program.Rounds))
		if r.ProgramCPU != nil {
			fmt.Fprintf(w, "eBPF: CPU time of that programming (user + system, robust to other load): median %.3f s [%.3f–%.3f]\n",
				r.ProgramCPU.Median, r.ProgramCPU.Min, r.ProgramCPU.Max)
		}
		fmt.Fprintf(w, "eBPF: endpoint change to map (full Sync of that state): p50 %.2f ms, p99 %.2f ms, max %.2f ms; CPU %.2f ms per change\n",
			r.ChangeP50, r.ChangeP99, r.ChangeMax, r.ChangeCPUms)
	}
}

// printErrors lists, for every path that had errors, what they were and
// the kernel's TCP counters over its measurements.
func printErrors(w io.Writer, rows []Row) {
	for _, row := range rows {
		for _, p := range slices.Sorted(maps.Keys(row.Paths)) {
			printStatErrors(w, fmt.Sprintf("%s services %s %s", human(float64(row.Services)), row.Test, p), row.Paths[p])
		}
	}
}

func printStatErrors(w io.Writer, what string, s *Stat) {
	if s.Errors == 0 {
		return
	}
	fmt.Fprintf(w, "  errors %s: %d in %s operations (%.1f per 10^5)", what, s.Errors, human(float64(s.Ops)), float64(s.Errors)*1e5/float64(max(s.Ops, 1)))
	for _, k := range slices.Sorted(maps.Keys(s.ErrorKinds)) {
		fmt.Fprintf(w, "; %s %d", k, s.ErrorKinds[k])
	}
	if len(s.KernelCounters) > 0 {
		fmt.Fprintf(w, "; kernel:")
		for _, k := range slices.Sorted(maps.Keys(s.KernelCounters)) {
			fmt.Fprintf(w, " %s %d", k, s.KernelCounters[k])
		}
	}
	fmt.Fprintln(w)
}
