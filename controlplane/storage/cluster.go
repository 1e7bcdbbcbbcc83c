package storage

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Member is one member of the etcd cluster.
type Member struct {
	ID         uint64
	Name       string
	PeerURLs   []string
	ClientURLs []string
	IsLearner  bool
}

// Members lists the etcd cluster's members.
func (s *Store) Members(ctx context.Context) ([]Member, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	resp, err := s.kc.MemberList(ctx)
	if err != nil {
		return nil, mapErr(err)
	}
	return members(resp.Members), nil
}

func members(ms []*etcdserverpb.Member) []Member {
	var out []Member
	for _, m := range ms {
		out = append(out, Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
	}
	return out
}

// RemoveMember removes the member called name from the etcd cluster
// (removing a server removes its member); a name no member has is not an
// error. The last voting member cannot be removed.
func (s *Store) RemoveMember(ctx context.Context, name string) error {
	return removeMember(ctx, s.kc.Client, name, s.timeout)
}

func removeMember(ctx context.Context, c *clientv3.Client, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.MemberList(ctx)
	if err != nil {
		return mapErr(err)
	}
	for _, m := range resp.Members {
		if m.Name != name {
			continue
		}
		if _, err := c.MemberRemove(ctx, m.ID); err != nil && !errors.Is(err, rpctypes.ErrMemberNotFound) {
			return fmt.Errorf("remove etcd member %s (%x): %w", name, m.ID, err)
		}
	}
	return nil
}

// JoinConfig is how an embedded member joins an existing cluster.
type JoinConfig struct {
	// Endpoints are client URLs of existing members.
	Endpoints []string
	// TLS is the client TLS of those endpoints (an etcd client
	// certificate from the cluster's etcd CA).
	TLS *tls.Config
}

func joinClient(j *JoinConfig, timeout time.Duration) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: j.Endpoints, TLS: j.TLS, DialTimeout: timeout, Logger: zap.NewNop()})
}

// addLearner adds this member (name, peerURL) to the cluster as a learner,
// as etcd recommends for a new member (it cannot vote, so it cannot cost the
// cluster its quorum while it catches up), and returns the initial-cluster
// string to start it with. A member of that name already there with the
// same peer URL (a join retried after a crash) is reused.
func addLearner(ctx context.Context, j *JoinConfig, name, peerURL string, timeout time.Duration) (string, error) {
	c, err := joinClient(j, timeout)
	if err != nil {
		return "", fmt.Errorf("etcd client for %v: %w", j.Endpoints, err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	list, err := c.MemberList(ctx)
	if err != nil {
		return "", fmt.Errorf("etcd members at %v: %w", j.Endpoints, err)
	}
	var have bool
	for _, m := range list.Members {
		if slices.Contains(m.PeerURLs, peerURL) {
			if m.Name != "" && m.Name != name {
				return "", fmt.Errorf("etcd member %q already has peer URL %s", m.Name, peerURL)
			}
			have = true
		} else if m.Name == name {
			return "", fmt.Errorf("an etcd member named %q already exists with peer URLs %v: remove it first (waggle server remove %s)", name, m.PeerURLs, name)
		}
	}
	ms := list.Members
	for !have {
		resp, err := c.MemberAddAsLearner(ctx, []string{peerURL})
		if err == nil {
			ms = resp.Members
			break
		}
		// etcd refuses a new member until the started ones have been
		// connected a few seconds ("unhealthy cluster"): a member that
		// just joined counts only then.
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			return "", fmt.Errorf("add etcd learner %s (%s): %w", name, peerURL, err)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("add etcd learner %s (%s): %w", name, peerURL, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
	var parts []string
	for _, m := range ms {
		n := m.Name
		if slices.Contains(m.PeerURLs, peerURL) {
			n = name
		}
		if n == "" {
			continue // another member still joining: not started yet
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	return strings.Join(parts, ","), nil
}

// promote promotes the learner name to a voting member once it has caught
// up with the leader (etcd refuses before, with "can only promote a learner
// member which is in sync with leader"), retrying until ctx ends.
func promote(ctx context.Context, j *JoinConfig, name string, timeout time.Duration) error {
	c, err := joinClient(j, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		list, err := c.MemberList(cctx)
		if err == nil {
			var id uint64
			learner := false
			for _, m := range list.Members {
				if m.Name == name {
					id, learner = m.ID, m.IsLearner
				}
			}
			switch {
			case id == 0:
				err = fmt.Errorf("no etcd member named %s", name)
			case !learner:
				cancel()
				return nil
			default:
				_, err = c.MemberPromote(cctx, id)
				if err == nil {
					cancel()
					return nil
				}
			}
		}
		cancel()
		select {
		case <-ctx.Done():
			return fmt.Errorf("promote etcd learner %s: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
