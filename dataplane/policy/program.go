package policy

import (
	"errors"
	"fmt"
)

// Program writes one Compile's changes through dp, make-before-break:
// every changed endpoint's new entries and isolation first, then the
// address and prefix tables, then the endpoints' removals (and revision
// bumps), and last the endpoints that are gone. Names of policies and
// identities are refreshed. A datapath with a Commit method batches the
// calls and writes them out when Commit is called last.
func Program(dp Datapath, c *Compiler, ch Changes) error {
	var errs []error
	for k, st := range ch.Endpoints {
		if st == nil {
			continue
		}
		if err := dp.ApplyEndpoint(st, false); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", k, err))
		}
	}
	if ch.IPCache != nil {
		if err := dp.ApplyIPCache(ch.IPCache); err != nil {
			errs = append(errs, err)
		}
		ids := map[uint32]string{}
		for id, idn := range c.byID {
			ids[id] = idn.Describe()
		}
		if err := dp.SetNames(NameIdentity, ids); err != nil {
			errs = append(errs, err)
		}
	}
	if ch.CIDRs != nil {
		if err := dp.ApplyCIDRs(ch.CIDRs); err != nil {
			errs = append(errs, err)
		}
	}
	for k, st := range ch.Endpoints {
		if st == nil {
			continue
		}
		if err := dp.ApplyEndpoint(st, true); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", k, err))
		}
	}
	reused := map[uint32]bool{}
	for _, st := range ch.Endpoints {
		if st != nil {
			reused[st.Ifindex] = true
		}
	}
	for k, ifindex := range ch.Removed {
		if reused[ifindex] {
			continue // another pod has the ifindex now; its prune removed the old entries
		}
		if err := dp.RemoveEndpoint(ifindex); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %s: %w", k, err))
		}
	}
	if err := dp.SetNames(NamePolicy, c.PolicyNames()); err != nil {
		errs = append(errs, err)
	}
	// A datapath that batches (iptables) writes it all out now.
	if b, ok := dp.(interface{ Commit() error }); ok {
		if err := b.Commit(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
