package inspect

import (
	"fmt"
	"strings"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
)

// Verdicts of explain.
const (
	VerdictBalanced = "balanced" // a fresh slot choice among the backends
	VerdictAffinity = "affinity" // the client's affinity entry pins the backend
	VerdictRefused  = "refused"  // connect()/sendmsg() fail with ECONNREFUSED
)

// Explanation is `waggle bpf explain`: what bpf/sock_lb.c's xlate_fwd
// would do with a connection from Client to Frontend, given the maps as
// they are now.
type Explanation struct {
	Frontend    string      `json:"frontend"`
	ServiceID   uint32      `json:"serviceID"`
	Service     string      `json:"service,omitempty"`
	Kind        string      `json:"kind,omitempty"`
	Client      string      `json:"client"`
	NetnsCookie uint64      `json:"netnsCookie,omitempty"`
	Verdict     string      `json:"verdict"`
	Summary     string      `json:"summary"`
	Errno       string      `json:"errno,omitempty"`
	Candidates  []Candidate `json:"candidates"`
	Steps       []string    `json:"steps"`
}

// Candidate is one slot a fresh choice can land on, with its chance and
// what then happens.
type Candidate struct {
	Slot        int     `json:"slot"`
	BackendID   uint32  `json:"backendID"`
	Backend     string  `json:"backend"`
	Probability string  `json:"probability"`
	Chance      float64 `json:"chance"`
	Outcome     string  `json:"outcome"`
}

func (in *inspector) explain(src, arg string) (*Explanation, error) {
	ap, proto, err := parseFrontend(arg)
	if err != nil {
		return nil, err
	}
	if proto == "" {
		proto = dataplane.TCP
	}
	key := dataplane.FrontendKey{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto}
	var cookie uint64
	client := "any client"
	if src != "" {
		if cookie, err = in.sys.NetnsCookie(src); err != nil {
			return nil, err
		}
		client = fmt.Sprintf("netns %s (cookie %d)", src, cookie)
		if strings.HasPrefix(src, "cookie:") {
			client = fmt.Sprintf("netns cookie %d", cookie)
		}
	}
	fs, err := in.frontends()
	if err != nil {
		return nil, err
	}
	var f *Frontend
	for i := range fs {
		if fs[i].key == key {
			f = &fs[i]
		}
	}
	if f == nil {
		return nil, fmt.Errorf("%s is no frontend (no slot-0 entry in %s): a connection to it is not translated "+
			"and goes to that address itself: %w", key, ebpf.MapServices, ErrNotFound)
	}
	e := &Explanation{Frontend: f.Frontend, ServiceID: f.ID, Service: f.Service, Kind: f.Kind, Client: client,
		NetnsCookie: cookie, Candidates: []Candidate{}}
	flags := "none"
	if len(f.Flags) > 0 {
		flags = strings.Join(f.Flags, ",")
	}
	e.step("%s has %s slot 0 (master): count %d, flags %s, service ID %d, affinity timeout %s",
		ebpf.MapServices, f.Frontend, f.Count, flags, f.ID, f.AffinityTimeout)
	if f.Count == 0 {
		e.Verdict, e.Errno = VerdictRefused, "ECONNREFUSED"
		e.Summary = "ECONNREFUSED: the Service has no ready or serving endpoint"
		e.step("count 0: the program refuses (%s_refused += 1)", map[dataplane.Protocol]string{dataplane.TCP: "connect", dataplane.UDP: "sendmsg"}[proto])
		return e, nil
	}
	bes, err := in.backendAddrs()
	if err != nil {
		return nil, err
	}
	affinity := f.AffinityTimeout > 0 && contains(f.Flags, "affinity")
	if affinity {
		if err := in.explainAffinity(e, f, src != "", cookie, bes); err != nil {
			return nil, err
		}
		if e.Verdict != "" {
			return e, nil
		}
	}
	// A fresh choice among count slots, as pick_slot.
	n := f.Count
	ok := 0
	for _, s := range f.Backends {
		if s.Slot > n {
			continue
		}
		c := Candidate{Slot: s.Slot, BackendID: s.BackendID, Backend: s.Backend,
			Probability: fmt.Sprintf("1/%d", n), Chance: 1 / float64(n), Outcome: "connects"}
		switch {
		case s.State == StateSlotMissing:
			c.Outcome = "refused: slot entry missing (backend_missing)"
		case s.State == StateBackendMissing:
			c.Outcome = fmt.Sprintf("refused: backend %d missing from %s (backend_missing)", s.BackendID, ebpf.MapBackends)
		case f.key.Addr.Is4() && !isV4(s.Backend):
			c.Outcome = "refused for IPv4 sockets: the backend is IPv6 (backend_missing)"
		default:
			ok++
		}
		e.Candidates = append(e.Candidates, c)
	}
	how := "TCP: a fresh random slot per connect (bpf_get_prandom_u32)"
	if proto == dataplane.UDP {
		how = "UDP: the slot follows the socket cookie's hash, so one socket keeps its backend and sockets spread evenly"
	}
	e.step("slot = 1 + r %% %d; %s", n, how)
	switch {
	case ok == 0:
		e.Verdict, e.Errno = VerdictRefused, "ECONNREFUSED"
		e.Summary = fmt.Sprintf("ECONNREFUSED: none of the %d slots leads to a usable backend", n)
	case n == 1:
		e.Verdict = VerdictBalanced
		e.Summary = "its only backend"
	case ok == n:
		e.Verdict = VerdictBalanced
		e.Summary = fmt.Sprintf("one of %d backends, each 1/%d", n, n)
	default:
		e.Verdict = VerdictBalanced
		e.Summary = fmt.Sprintf("one of %d slots, each 1/%d: %d connect, %d refused (ECONNREFUSED)", n, n, ok, n-ok)
	}
	if affinity {
		e.step("the chosen backend is written to %s for this client's netns (sticky for %s after the last use)",
			ebpf.MapAffinity, f.AffinityTimeout)
	}
	e.step("the backend is remembered in %s under the socket's cookie, so recvmsg and getpeername show %s",
		ebpf.MapReverseSockets, f.Frontend)
	return e, nil
}

func (in *inspector) explainAffinity(e *Explanation, f *Frontend, haveClient bool, cookie uint64, bes map[uint32]string) error {
	entries, err := in.src.Affinity()
	if err != nil {
		return err
	}
	if !haveClient {
		n := 0
		for _, a := range entries {
			if a.ServiceID == f.ID {
				n++
			}
		}
		e.step("session affinity: %d client netns have an entry in %s (see affinity list); give SRC to explain one client",
			n, ebpf.MapAffinity)
		return nil
	}
	all, err := in.src.Backends()
	if err != nil {
		return err
	}
	gens := map[uint32]uint32{}
	for _, b := range all {
		gens[b.ID] = b.Gen
	}
	now := in.sys.Monotonic()
	for _, a := range entries {
		if a.ServiceID != f.ID || a.NetnsCookie != cookie {
			continue
		}
		age := max(0, now-a.LastUsed)
		switch addr, ok := bes[a.BackendID]; {
		case age > f.AffinityTimeout:
			e.step("%s has an entry for this client -> backend %d, last used %s ago: expired (timeout %s); it is deleted and a fresh slot chosen",
				ebpf.MapAffinity, a.BackendID, age.Truncate(time.Second), f.AffinityTimeout)
		case !ok:
			e.step("%s has an entry for this client -> backend %d, which %s lacks: a fresh slot is chosen",
				ebpf.MapAffinity, a.BackendID, ebpf.MapBackends)
		case gens[a.BackendID] != a.BackendGen:
			e.step("%s has an entry for this client -> backend %d generation %d, but the ID now holds generation %d (another backend): a fresh slot is chosen",
				ebpf.MapAffinity, a.BackendID, a.BackendGen, gens[a.BackendID])
		case f.key.Addr.Is4() && !isV4(addr):
			e.step("%s pins this client to backend %d (%s), an IPv6 backend: IPv4 sockets are refused", ebpf.MapAffinity, a.BackendID, addr)
			e.Verdict, e.Errno = VerdictRefused, "ECONNREFUSED"
			e.Summary = "ECONNREFUSED: the affinity entry names an IPv6 backend"
		default:
			e.step("%s pins this client to backend %d (%s), last used %s ago, within the timeout %s (affinity_hit += 1)",
				ebpf.MapAffinity, a.BackendID, addr, age.Truncate(time.Second), f.AffinityTimeout)
			e.Verdict = VerdictAffinity
			e.Summary = fmt.Sprintf("%s (affinity entry; stays until unused for %s)", addr, f.AffinityTimeout)
			e.Candidates = append(e.Candidates, Candidate{BackendID: a.BackendID, Backend: addr, Probability: "1", Chance: 1, Outcome: "connects"})
			for _, s := range f.Backends {
				if s.BackendID == a.BackendID {
					e.Candidates[0].Slot = s.Slot
				}
			}
		}
		return nil
	}
	e.step("session affinity: %s has no entry for this client: a fresh slot is chosen", ebpf.MapAffinity)
	return nil
}

func (e *Explanation) step(format string, args ...any) {
	e.Steps = append(e.Steps, fmt.Sprintf(format, args...))
}

func isV4(addrPort string) bool {
	return !strings.HasPrefix(addrPort, "[")
}
