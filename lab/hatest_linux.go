package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/controlplane/storage"
	"github.com/waggle-io/waggle/internal/apilb"
)

type haServer struct {
	i    int
	n    NodeState
	p    Process
	kc   string
	etcd string
}

// RunHAScenario runs one scenario on the lab under dataDir.
// writeTimeout bounds each of the writer's writes (a write sent to a dying
// server waits that long before it is retried elsewhere).
func RunHAScenario(ctx context.Context, dataDir, scenario string, duration, writeTimeout time.Duration, out io.Writer) (*HAResult, error) {
	st, err := LoadState(dataDir)
	if err != nil {
		return nil, err
	}
	if len(st.Servers) < 3 {
		return nil, errors.New("the HA scenarios need a lab with --servers 3 or more")
	}
	var servers []*haServer
	for i, n := range st.Servers {
		s := &haServer{i: i + 1, n: n, kc: filepath.Join(serverDir(dataDir, i+1), "admin.kubeconfig"), etcd: "https://" + n.Addr + ":2379"}
		for _, p := range st.Processes {
			if p.Node == n.Name && p.Name == "control-plane" {
				s.p = p
			}
		}
		servers = append(servers, s)
	}
	leader, err := etcdLeader(ctx, dataDir, servers)
	if err != nil {
		return nil, err
	}
	port, err := apiPort(servers[0].kc)
	if err != nil {
		return nil, err
	}
	probe, err := clientForLB(ctx, servers[0].kc)
	if err != nil {
		return nil, err
	}
	var victim *haServer
	var victimLeads []string
	switch scenario {
	case ScenarioKillEtcdLeader:
		victim = leader
	case ScenarioPartition:
		for _, s := range servers {
			if s != leader {
				victim = s
			}
		}
	case ScenarioKillAPIServer, ScenarioDualStack:
		// The server most node agents talk to.
		conns := agentConns(st, port)
		for _, s := range servers {
			if victim == nil || conns[s.n.Addr] > conns[victim.n.Addr] {
				victim = s
			}
		}
		fmt.Fprintf(out, "node agents' connections to the API servers: %v\n", conns)
	case ScenarioKillLeader:
		h, err := leaseHolder(ctx, probe, "kube-controller-manager")
		if err != nil {
			return nil, err
		}
		if victim = serverOf(servers, h); victim == nil {
			return nil, fmt.Errorf("the controller-manager's Lease holder %q is none of the lab's servers", h)
		}
	default:
		return nil, fmt.Errorf("unknown scenario %q (want one of %s)", scenario, strings.Join(Scenarios, ", "))
	}
	for _, l := range []string{"kube-controller-manager", "kube-scheduler"} {
		if h, err := leaseHolder(ctx, probe, l); err == nil && serverOf(servers, h) == victim {
			victimLeads = append(victimLeads, l)
		}
	}
	if victim == leader {
		victimLeads = append(victimLeads, "etcd")
	}
	var survivors []*haServer
	for _, s := range servers {
		if s != victim {
			survivors = append(survivors, s)
		}
	}
	fmt.Fprintf(out, "etcd leader: %s; victim: %s (%s)\n", leader.n.Name, victim.n.Name, scenario)
	res := &HAResult{Scenario: scenario, Victim: victim.n.Name, VictimLeads: victimLeads}
	fmt.Fprintf(out, "the victim leads: %v\n", victimLeads)
	ns := "ha-test-" + strconv.FormatInt(time.Now().Unix(), 36)
	admin, err := clientForLB(ctx, survivors[0].kc)
	if err != nil {
		return nil, err
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	// One informer per survivor, each on that server only.
	type inf struct {
		store cache.Store
		stop  chan struct{}
	}
	var infs []inf
	for _, s := range survivors {
		cs, err := clientFor(s.kc)
		if err != nil {
			return nil, err
		}
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
		i := f.Core().V1().ConfigMaps().Informer()
		stop := make(chan struct{})
		f.Start(stop)
		cache.WaitForCacheSync(stop, i.HasSynced)
		infs = append(infs, inf{store: i.GetStore(), stop: stop})
	}
	defer func() {
		for _, i := range infs {
			close(i.stop)
		}
	}()
	// Every scenario: the nodes' Ready conditions and Lease renewals, and
	// the node agents' processes.
	nw := watchNodes(admin)
	defer close(nw.stop)
	var agents []Process
	for _, p := range st.Processes {
		if p.Name == "kubelet" || p.Name == "proxy" {
			agents = append(agents, p)
		}
	}
	proxyBase := map[string]float64{}
	if scenario == ScenarioKillAPIServer {
		for _, n := range st.Nodes {
			v, err := proxyServices(ctx, n.Addr)
			if err != nil {
				return nil, err
			}
			proxyBase[n.Name] = v
		}
		res.AgentsOnVictim = agentConns(st, port)[victim.n.Addr]
	}
	if scenario == ScenarioDualStack {
		res.AgentsOnVictim = agentConns(st, port)[victim.n.Addr]
	}
	var ds *dsProbe
	if scenario == ScenarioDualStack {
		if ds, err = startDualStackProbe(ctx, admin, st, dataDir, survivors[0].kc, ns); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "dual-stack Service %s/%s answers on [%s]:80 and NodePort %d on %v\n", ns, dsProbeName, ds.clusterIP6, ds.nodePort, ds.nodes6)
	}
	if scenario == ScenarioKillLeader {
		// The ReplicaSet the fault scales, and the ServiceAccount its pods
		// need (the controller-manager makes it).
		if err := waitFor(ctx, 45*time.Second, "the default ServiceAccount of "+ns, func() error {
			_, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err
		}); err != nil {
			return nil, err
		}
		if _, err := admin.AppsV1().ReplicaSets(ns).Create(ctx, probeReplicaSet(), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}

	// The writer: through the failover dialer, seeded on a survivor.
	writer, err := clientForLB(ctx, survivors[0].kc)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var acks []time.Time
	acked := map[string]bool{}
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seq := 0; wctx.Err() == nil; seq++ {
			name := fmt.Sprintf("w%06d", seq)
			cctx, cancel := context.WithTimeout(wctx, writeTimeout)
			_, err := writer.CoreV1().ConfigMaps(ns).Create(cctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"seq": strconv.Itoa(seq)}}, metav1.CreateOptions{})
			cancel()
			mu.Lock()
			switch {
			case err == nil || apierrors.IsAlreadyExists(err):
				// AlreadyExists: an earlier attempt was applied though
				// its answer was lost; the object is there.
				acked[name] = true
				acks = append(acks, time.Now())
			default:
				res.Failed++
				seq-- // retry the same name: a timed-out write may have landed
			}
			mu.Unlock()
		}
	}()
	time.Sleep(duration / 3)
	fault := time.Now()
	switch scenario {
	case ScenarioKillEtcdLeader, ScenarioKillAPIServer, ScenarioKillLeader, ScenarioDualStack:
		if err := syscall.Kill(victim.p.PID, syscall.SIGKILL); err != nil {
			stopWriter()
			return nil, fmt.Errorf("kill %s: %w", victim.n.Name, err)
		}
	case ScenarioPartition:
		if b, err := exec.Command("ip", "link", "set", victim.n.HostVeth, "down").CombinedOutput(); err != nil {
			stopWriter()
			return nil, fmt.Errorf("partition %s: %v: %s", victim.n.Name, err, b)
		}
		// The minority must refuse writes: one from inside its namespace,
		// straight to its own API server.
		cmd := exec.Command("ip", "netns", "exec", victim.n.NetNS, "kubectl", "--kubeconfig", victim.kc, "--request-timeout=5s",
			"-n", ns, "create", "configmap", "minority-write")
		b, err := cmd.CombinedOutput()
		res.MinorityRefused = err != nil
		fmt.Fprintf(out, "write to the partitioned %s: %v %s\n", victim.n.Name, err, b)
	}
	// A measurement that fails is reported with the rest of the run.
	var measureErr error
	switch scenario {
	case ScenarioKillAPIServer:
		measureErr = measureProxies(ctx, admin, ns, st, proxyBase, fault, res)
	case ScenarioKillLeader:
		measureErr = measureLeader(ctx, admin, ns, servers, victim, fault, res)
	case ScenarioDualStack:
		measureErr = measureDualStack(ctx, admin, ds, fault, res)
	}
	if rest := time.Until(fault.Add(duration - duration/3)); rest > 0 {
		time.Sleep(rest)
	}
	stopWriter()
	wg.Wait()
	last := time.Now()
	if scenario == ScenarioPartition {
		if b, err := exec.Command("ip", "link", "set", victim.n.HostVeth, "up").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("heal %s: %v: %s", victim.n.Name, err, b)
		}
	}
	res.Acked = len(acked)
	nw.results(res, fault, st.Nodes)
	for _, p := range agents {
		if !alive(p) {
			res.Restarted = append(res.Restarted, p.Node+"/"+p.Name)
		}
	}
	res.AgentsAfter = map[string]int{}
	for addr, n := range agentConns(st, port) {
		name := addr
		for _, s := range servers {
			if s.n.Addr == addr {
				name = s.n.Name
			}
		}
		res.AgentsAfter[name] = n
	}
	for i, t := range acks {
		if i == 0 {
			continue
		}
		gap := t.Sub(acks[i-1])
		if gap > res.MaxGap {
			res.MaxGap = gap
		}
		// The pause the fault caused: the longest gap between two
		// acknowledged writes that ends after the fault.
		if t.After(fault) && gap > res.Resume {
			res.Resume = gap
		}
	}
	// Every acknowledged write is on every survivor, and the survivors'
	// informers converge to exactly that set.
	for _, s := range survivors {
		cs, err := clientFor(s.kc)
		if err != nil {
			return nil, err
		}
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list on %s: %w", s.n.Name, err)
		}
		have := map[string]bool{}
		for _, c := range l.Items {
			have[c.Name] = true
		}
		for n := range acked {
			if !have[n] {
				res.Lost++
			}
		}
	}
	// The informers must hold exactly what the store holds (the
	// acknowledged writes, and a last one the writer gave up on that may
	// still have landed).
	var want []string
	{
		cs, err := clientFor(survivors[0].kc)
		if err != nil {
			return nil, err
		}
		l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, c := range l.Items {
			if strings.HasPrefix(c.Name, "w") {
				want = append(want, c.Name)
			}
		}
		sort.Strings(want)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok := true
		for _, i := range infs {
			var got []string
			for _, o := range i.store.List() {
				if c := o.(*corev1.ConfigMap); strings.HasPrefix(c.Name, "w") {
					got = append(got, c.Name)
				}
			}
			sort.Strings(got)
			if !slices.Equal(got, want) {
				ok = false
			}
		}
		if ok {
			res.Converge = time.Since(last)
			break
		}
		if time.Now().After(deadline) {
			return res, errors.New("the survivors' informers did not converge to the acknowledged writes within 60 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if scenario == ScenarioPartition {
		healed := time.Now()
		cs, err := clientFor(victim.kc)
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			l, err := cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.Everything().String()})
			if err == nil {
				n := 0
				for _, c := range l.Items {
					if acked[c.Name] {
						n++
					}
				}
				if n == len(acked) {
					res.CaughtUp, res.CatchUp = true, time.Since(healed)
					break
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	_ = admin.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns, metav1.DeleteOptions{})
	return res, measureErr
}

func clientForLB(ctx context.Context, kubeconfig string) (*kubernetes.Clientset, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = -1, 0
	return kubernetes.NewForConfig(apilb.Wrap(ctx, rc, slog.New(slog.DiscardHandler)))
}

// etcdLeader finds the server whose etcd member leads, with the first
// server's etcd client certificate.
func etcdLeader(ctx context.Context, dataDir string, servers []*haServer) (*haServer, error) {
	pki := filepath.Join(serverDir(dataDir, servers[0].i), "pki")
	tc, err := storage.ClientTLS(filepath.Join(pki, "etcd", "ca.crt"), filepath.Join(pki, "apiserver-etcd-client.crt"), filepath.Join(pki, "apiserver-etcd-client.key"))
	if err != nil {
		return nil, err
	}
	var eps []string
	for _, s := range servers {
		eps = append(eps, s.etcd)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, s := range servers {
		stt, err := c.Status(cctx, s.etcd)
		if err != nil {
			continue
		}
		list, err := c.MemberList(cctx)
		if err != nil {
			return nil, err
		}
		for _, m := range list.Members {
			if m.ID == stt.Leader {
				for _, s2 := range servers {
					if s2.n.Name == m.Name {
						return s2, nil
					}
				}
			}
		}
	}
	return nil, errors.New("no etcd leader found among the lab's servers")
}

// measureProxies creates a Service right after the fault and waits for every
// node's proxy to program it.
func measureProxies(ctx context.Context, cs kubernetes.Interface, ns string, st *State, base map[string]float64, fault time.Time, res *HAResult) error {
	if err := createProbeService(ctx, cs, ns); err != nil {
		return fmt.Errorf("create the probe Service: %w", err)
	}
	return pollFor(ctx, 45*time.Second, 100*time.Millisecond, "every proxy to program the probe Service", func() error {
		for _, n := range st.Nodes {
			v, err := proxyServices(ctx, n.Addr)
			if err != nil {
				return err
			}
			if v <= base[n.Name] {
				return fmt.Errorf("the proxy of %s programs %v Services, %v before", n.Name, v, base[n.Name])
			}
		}
		res.ProxyProgrammed = time.Since(fault)
		return nil
	})
}

// measureLeader scales the probe ReplicaSet right after the fault and times
// the Lease takeovers, the pods the new controller-manager leader creates and
// their binding by the scheduler.
func measureLeader(ctx context.Context, cs kubernetes.Interface, ns string, servers []*haServer, victim *haServer, fault time.Time, res *HAResult) error {
	const replicas = 2
	if err := retryWrite(ctx, func(ctx context.Context) error {
		_, err := cs.AppsV1().ReplicaSets(ns).Patch(ctx, "ha-probe", types.MergePatchType,
			[]byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)), metav1.PatchOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("scale the probe ReplicaSet: %w", err)
	}
	schedLed := slices.Contains(res.VictimLeads, "kube-scheduler")
	return pollFor(ctx, 60*time.Second, 100*time.Millisecond, "the new leaders to act", func() error {
		now := time.Since(fault)
		if res.Takeover == 0 {
			if h, err := leaseHolder(ctx, cs, "kube-controller-manager"); err == nil && h != "" && serverOf(servers, h) != victim {
				res.Takeover = now
			}
		}
		if schedLed && res.SchedulerTakeover == 0 {
			if h, err := leaseHolder(ctx, cs, "kube-scheduler"); err == nil && h != "" && serverOf(servers, h) != victim {
				res.SchedulerTakeover = now
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		l, err := cs.CoreV1().Pods(ns).List(cctx, metav1.ListOptions{LabelSelector: "app=ha-probe"})
		if err != nil {
			return err
		}
		bound := 0
		for _, p := range l.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if res.FirstAction == 0 && len(l.Items) >= replicas {
			res.FirstAction = now
		}
		if res.Scheduled == 0 && bound >= replicas {
			res.Scheduled = now
		}
		if res.Takeover == 0 || res.FirstAction == 0 || res.Scheduled == 0 || (schedLed && res.SchedulerTakeover == 0) {
			return fmt.Errorf("%d of %d pods, %d bound", len(l.Items), replicas, bound)
		}
		return nil
	})
}
