package printers

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
)

var objectMetaDocs = metav1.ObjectMeta{}.SwaggerDoc()

func col(name, typ, desc string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: typ, Description: desc}
}

func wide(c metav1.TableColumnDefinition) metav1.TableColumnDefinition {
	c.Priority = 1
	return c
}

var (
	nameCol = metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: objectMetaDocs["name"]}
	ageCol  = col("Age", "string", objectMetaDocs["creationTimestamp"])
)

const none = "<none>"

func init() {
	registerCore()
	registerApps()
	registerDiscovery()
	registerAPIServices()
	registerCoordination()
}

// registerCore registers the columns of the core group (v1), as kubectl prints them.
func registerCore() {
	registerWithConditions([]metav1.TableColumnDefinition{
		nameCol,
		col("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
		col("Status", "string", "The aggregate status of the containers in this pod."),
		col("Restarts", "string", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
		ageCol,
		wide(col("IP", "string", corev1.PodStatus{}.SwaggerDoc()["podIP"])),
		wide(col("Node", "string", corev1.PodSpec{}.SwaggerDoc()["nodeName"])),
		wide(col("Nominated Node", "string", corev1.PodStatus{}.SwaggerDoc()["nominatedNodeName"])),
		wide(col("Readiness Gates", "string", corev1.PodSpec{}.SwaggerDoc()["readinessGates"])),
	}, podRow)

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Type", "string", "The type of the service."),
		col("Cluster-IP", "string", "The IP address of the service."),
		col("External-IP", "string", "The external IP address of the service."),
		col("Port(s)", "string", "The ports exposed by the service."),
		ageCol,
		wide(col("Selector", "string", corev1.ServiceSpec{}.SwaggerDoc()["selector"])),
	}, func(s *corev1.Service, now time.Time) []any {
		clusterIP := none
		if len(s.Spec.ClusterIPs) > 0 {
			clusterIP = s.Spec.ClusterIPs[0]
		} else if s.Spec.ClusterIP != "" {
			clusterIP = s.Spec.ClusterIP
		}
		ports := servicePorts(s.Spec.Ports)
		if ports == "" {
			ports = none
		}
		return []any{s.Name, string(s.Spec.Type), clusterIP, serviceExternalIP(s), ports, age(s.CreationTimestamp, now), labels.FormatLabels(s.Spec.Selector)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Status", "string", "The status of the node"),
		col("Roles", "string", "The roles of the node"),
		ageCol,
		col("Version", "string", corev1.NodeSystemInfo{}.SwaggerDoc()["kubeletVersion"]),
		wide(col("Internal-IP", "string", corev1.NodeStatus{}.SwaggerDoc()["addresses"])),
		wide(col("External-IP", "string", corev1.NodeStatus{}.SwaggerDoc()["addresses"])),
		wide(col("OS-Image", "string", corev1.NodeSystemInfo{}.SwaggerDoc()["osImage"])),
		wide(col("Kernel-Version", "string", corev1.NodeSystemInfo{}.SwaggerDoc()["kernelVersion"])),
		wide(col("Container-Runtime", "string", corev1.NodeSystemInfo{}.SwaggerDoc()["containerRuntimeVersion"])),
	}, nodeRow)

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Status", "string", "The status of the namespace"),
		ageCol,
	}, func(n *corev1.Namespace, now time.Time) []any {
		return []any{n.Name, string(n.Status.Phase), age(n.CreationTimestamp, now)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Endpoints", "string", corev1.Endpoints{}.SwaggerDoc()["subsets"]),
		ageCol,
	}, func(e *corev1.Endpoints, now time.Time) []any {
		return []any{e.Name, formatEndpoints(e), age(e.CreationTimestamp, now)}
	})

	register([]metav1.TableColumnDefinition{
		col("Last Seen", "string", corev1.Event{}.SwaggerDoc()["lastTimestamp"]),
		col("Type", "string", corev1.Event{}.SwaggerDoc()["type"]),
		col("Reason", "string", corev1.Event{}.SwaggerDoc()["reason"]),
		col("Object", "string", corev1.Event{}.SwaggerDoc()["involvedObject"]),
		wide(col("Subobject", "string", corev1.ObjectReference{}.SwaggerDoc()["fieldPath"])),
		wide(col("Source", "string", corev1.Event{}.SwaggerDoc()["source"])),
		col("Message", "string", corev1.Event{}.SwaggerDoc()["message"]),
		wide(col("First Seen", "string", corev1.Event{}.SwaggerDoc()["firstTimestamp"])),
		wide(col("Count", "integer", corev1.Event{}.SwaggerDoc()["count"])),
		wide(metav1.TableColumnDefinition{Name: "Name", Type: "string", Format: "name", Description: objectMetaDocs["name"]}),
	}, eventRow)

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Data", "string", corev1.ConfigMap{}.SwaggerDoc()["data"]),
		ageCol,
	}, func(c *corev1.ConfigMap, now time.Time) []any {
		return []any{c.Name, int64(len(c.Data) + len(c.BinaryData)), age(c.CreationTimestamp, now)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Type", "string", corev1.Secret{}.SwaggerDoc()["type"]),
		col("Data", "string", corev1.Secret{}.SwaggerDoc()["data"]),
		ageCol,
	}, func(s *corev1.Secret, now time.Time) []any {
		return []any{s.Name, string(s.Type), int64(len(s.Data) + len(s.StringData)), age(s.CreationTimestamp, now)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Secrets", "string", corev1.ServiceAccount{}.SwaggerDoc()["secrets"]),
		ageCol,
	}, func(s *corev1.ServiceAccount, now time.Time) []any {
		return []any{s.Name, int64(len(s.Secrets)), age(s.CreationTimestamp, now)}
	})

	// ComponentStatus as kubectl prints it: the Healthy condition.
	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Status", "string", "Status of the component conditions"),
		col("Message", "string", "Message of the component conditions"),
		col("Error", "string", "Error of the component conditions"),
	}, func(c *corev1.ComponentStatus, _ time.Time) []any {
		status, msg, errText := "Unknown", "", ""
		for _, cond := range c.Conditions {
			if cond.Type == corev1.ComponentHealthy {
				status = "Unhealthy"
				if cond.Status == corev1.ConditionTrue {
					status = "Healthy"
				}
				msg, errText = cond.Message, cond.Error
				break
			}
		}
		return []any{c.Name, status, msg, errText}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Target", "string", corev1.Binding{}.SwaggerDoc()["target"]),
		ageCol,
	}, func(b *corev1.Binding, now time.Time) []any {
		return []any{b.Name, b.Target.Kind + "/" + b.Target.Name, age(b.CreationTimestamp, now)}
	})
}

// registerApps registers the columns of apps/v1 workloads.
func registerApps() {
	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Ready", "string", "Number of the pod with ready state"),
		col("Up-to-date", "integer", appsv1.DeploymentStatus{}.SwaggerDoc()["updatedReplicas"]),
		col("Available", "integer", appsv1.DeploymentStatus{}.SwaggerDoc()["availableReplicas"]),
		ageCol,
		wide(col("Containers", "string", "Names of each container in the template.")),
		wide(col("Images", "string", "Images referenced by each container in the template.")),
		wide(col("Selector", "string", appsv1.DeploymentSpec{}.SwaggerDoc()["selector"])),
	}, func(d *appsv1.Deployment, now time.Time) []any {
		names, images := containerCells(d.Spec.Template.Spec.Containers)
		return []any{d.Name, fmt.Sprintf("%d/%d", d.Status.ReadyReplicas, replicas(d.Spec.Replicas)),
			int64(d.Status.UpdatedReplicas), int64(d.Status.AvailableReplicas), age(d.CreationTimestamp, now),
			names, images, selectorString(d.Spec.Selector)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Desired", "integer", appsv1.ReplicaSetSpec{}.SwaggerDoc()["replicas"]),
		col("Current", "integer", appsv1.ReplicaSetStatus{}.SwaggerDoc()["replicas"]),
		col("Ready", "integer", appsv1.ReplicaSetStatus{}.SwaggerDoc()["readyReplicas"]),
		ageCol,
		wide(col("Containers", "string", "Names of each container in the template.")),
		wide(col("Images", "string", "Images referenced by each container in the template.")),
		wide(col("Selector", "string", appsv1.ReplicaSetSpec{}.SwaggerDoc()["selector"])),
	}, func(r *appsv1.ReplicaSet, now time.Time) []any {
		names, images := containerCells(r.Spec.Template.Spec.Containers)
		return []any{r.Name, int64(replicas(r.Spec.Replicas)), int64(r.Status.Replicas), int64(r.Status.ReadyReplicas),
			age(r.CreationTimestamp, now), names, images, selectorString(r.Spec.Selector)}
	})

	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Desired", "integer", appsv1.DaemonSetStatus{}.SwaggerDoc()["desiredNumberScheduled"]),
		col("Current", "integer", appsv1.DaemonSetStatus{}.SwaggerDoc()["currentNumberScheduled"]),
		col("Ready", "integer", appsv1.DaemonSetStatus{}.SwaggerDoc()["numberReady"]),
		col("Up-to-date", "integer", appsv1.DaemonSetStatus{}.SwaggerDoc()["updatedNumberScheduled"]),
		col("Available", "integer", appsv1.DaemonSetStatus{}.SwaggerDoc()["numberAvailable"]),
		col("Node Selector", "string", corev1.PodSpec{}.SwaggerDoc()["nodeSelector"]),
		ageCol,
		wide(col("Containers", "string", "Names of each container in the template.")),
		wide(col("Images", "string", "Images referenced by each container in the template.")),
		wide(col("Selector", "string", appsv1.DaemonSetSpec{}.SwaggerDoc()["selector"])),
	}, func(d *appsv1.DaemonSet, now time.Time) []any {
		names, images := containerCells(d.Spec.Template.Spec.Containers)
		return []any{d.Name, int64(d.Status.DesiredNumberScheduled), int64(d.Status.CurrentNumberScheduled), int64(d.Status.NumberReady),
			int64(d.Status.UpdatedNumberScheduled), int64(d.Status.NumberAvailable), labels.FormatLabels(d.Spec.Template.Spec.NodeSelector),
			age(d.CreationTimestamp, now), names, images, selectorString(d.Spec.Selector)}
	})
}

// registerDiscovery registers the columns of discovery.k8s.io EndpointSlices.
func registerDiscovery() {
	register([]metav1.TableColumnDefinition{
		nameCol,
		col("AddressType", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["addressType"]),
		col("Ports", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["ports"]),
		col("Endpoints", "string", discoveryv1.EndpointSlice{}.SwaggerDoc()["endpoints"]),
		ageCol,
	}, func(e *discoveryv1.EndpointSlice, now time.Time) []any {
		return []any{e.Name, string(e.AddressType), slicePorts(e.Ports), sliceEndpoints(e.Endpoints), age(e.CreationTimestamp, now)}
	})
}

// registerAPIServices registers the columns of apiregistration.k8s.io APIServices, with kube-aggregator's columns.
func registerAPIServices() {
	// kube-aggregator's columns (pkg/registry/apiservice/etcd ConvertToTable).
	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Service", "string", "The reference to the service that hosts this API endpoint."),
		col("Available", "string", "Whether this service is available."),
		ageCol,
	}, func(a *apiregistrationv1.APIService, now time.Time) []any {
		service := "Local"
		if a.Spec.Service != nil {
			service = a.Spec.Service.Namespace + "/" + a.Spec.Service.Name
		}
		status := string(apiregistrationv1.ConditionUnknown)
		for _, c := range a.Status.Conditions {
			if c.Type != apiregistrationv1.Available {
				continue
			}
			status = string(c.Status)
			if c.Status != apiregistrationv1.ConditionTrue && c.Reason != "" {
				status = fmt.Sprintf("%s (%s)", c.Status, c.Reason)
			}
		}
		return []any{a.Name, service, status, age(a.CreationTimestamp, now)}
	})
}

// registerCoordination registers the columns of coordination.k8s.io Leases.
func registerCoordination() {
	register([]metav1.TableColumnDefinition{
		nameCol,
		col("Holder", "string", coordinationv1.LeaseSpec{}.SwaggerDoc()["holderIdentity"]),
		ageCol,
	}, func(l *coordinationv1.Lease, now time.Time) []any {
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		return []any{l.Name, holder, age(l.CreationTimestamp, now)}
	})
}

func replicas(p *int32) int32 {
	if p == nil {
		return 1 // the API default
	}
	return *p
}

func selectorString(s *metav1.LabelSelector) string {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return "<error>"
	}
	return sel.String()
}

func containerCells(cs []corev1.Container) (names, images string) {
	var n, i []string
	for _, c := range cs {
		n = append(n, c.Name)
		i = append(i, c.Image)
	}
	return strings.Join(n, ","), strings.Join(i, ",")
}

// podRow computes READY, STATUS and RESTARTS as kube-apiserver's printer.
func podRow(pod *corev1.Pod, now time.Time) ([]any, []metav1.TableRowCondition) {
	restarts, restartableInitRestarts := 0, 0
	total := len(pod.Spec.Containers)
	ready := 0
	var lastRestart, lastRestartableInitRestart metav1.Time

	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonSchedulingGated {
			reason = corev1.PodReasonSchedulingGated
		}
	}

	initContainers := map[string]*corev1.Container{}
	for i := range pod.Spec.InitContainers {
		ic := &pod.Spec.InitContainers[i]
		initContainers[ic.Name] = ic
		if restartable(ic) {
			total++
		}
	}

	initializing := false
	for i, cs := range pod.Status.InitContainerStatuses {
		restarts += int(cs.RestartCount)
		if t := cs.LastTerminationState.Terminated; t != nil && lastRestart.Before(&t.FinishedAt) {
			lastRestart = t.FinishedAt
		}
		if restartable(initContainers[cs.Name]) {
			restartableInitRestarts += int(cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil && lastRestartableInitRestart.Before(&t.FinishedAt) {
				lastRestartableInitRestart = t.FinishedAt
			}
		}
		switch {
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			continue
		case restartable(initContainers[cs.Name]) && cs.Started != nil && *cs.Started:
			if cs.Ready {
				ready++
			}
			continue
		case cs.State.Terminated != nil:
			switch t := cs.State.Terminated; {
			case t.Reason != "":
				reason = "Init:" + t.Reason
			case t.Signal != 0:
				reason = fmt.Sprintf("Init:Signal:%d", t.Signal)
			default:
				reason = fmt.Sprintf("Init:ExitCode:%d", t.ExitCode)
			}
			initializing = true
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + cs.State.Waiting.Reason
			initializing = true
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
			initializing = true
		}
		break
	}

	if !initializing || conditionTrue(pod.Status.Conditions, corev1.PodInitialized) {
		restarts = restartableInitRestarts
		lastRestart = lastRestartableInitRestart
		hasRunning := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := pod.Status.ContainerStatuses[i]
			restarts += int(cs.RestartCount)
			if t := cs.LastTerminationState.Terminated; t != nil && lastRestart.Before(&t.FinishedAt) {
				lastRestart = t.FinishedAt
			}
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				reason = cs.State.Waiting.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Reason != "":
				reason = cs.State.Terminated.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", cs.State.Terminated.Signal)
			case cs.State.Terminated != nil:
				reason = fmt.Sprintf("ExitCode:%d", cs.State.Terminated.ExitCode)
			case cs.Ready && cs.State.Running != nil:
				hasRunning = true
				ready++
			}
		}
		// Back to Running while one container still runs.
		if reason == "Completed" && hasRunning {
			if conditionTrue(pod.Status.Conditions, corev1.PodReady) {
				reason = "Running"
			} else {
				reason = "NotReady"
			}
		}
	}

	terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	if pod.DeletionTimestamp != nil && pod.Status.Reason == "NodeLost" {
		reason = "Unknown"
	} else if pod.DeletionTimestamp != nil && !terminal {
		reason = "Terminating"
	}

	restartsStr := strconv.Itoa(restarts)
	if restarts != 0 && !lastRestart.IsZero() {
		restartsStr = fmt.Sprintf("%d (%s ago)", restarts, age(lastRestart, now))
	}

	ip := ""
	if len(pod.Status.PodIPs) > 0 {
		ip = pod.Status.PodIPs[0].IP
	}
	if ip == "" {
		ip = pod.Status.PodIP
	}
	gates := none
	if len(pod.Spec.ReadinessGates) > 0 {
		n := 0
		for _, g := range pod.Spec.ReadinessGates {
			if conditionTrue(pod.Status.Conditions, g.ConditionType) {
				n++
			}
		}
		gates = fmt.Sprintf("%d/%d", n, len(pod.Spec.ReadinessGates))
	}
	cells := []any{pod.Name, fmt.Sprintf("%d/%d", ready, total), reason, restartsStr, age(pod.CreationTimestamp, now),
		orNone(ip), orNone(pod.Spec.NodeName), orNone(pod.Status.NominatedNodeName), gates}

	var conds []metav1.TableRowCondition
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		conds = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(pod.Status.Phase), Message: "The pod has completed successfully."}}
	case corev1.PodFailed:
		conds = []metav1.TableRowCondition{{Type: metav1.RowCompleted, Status: metav1.ConditionTrue, Reason: string(pod.Status.Phase), Message: "The pod failed."}}
	}
	return cells, conds
}

func restartable(c *corev1.Container) bool {
	return c != nil && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func conditionTrue(conds []corev1.PodCondition, t corev1.PodConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

func servicePorts(ports []corev1.ServicePort) string {
	pieces := make([]string, len(ports))
	for i, p := range ports {
		if p.NodePort > 0 {
			pieces[i] = fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol)
		} else {
			pieces[i] = fmt.Sprintf("%d/%s", p.Port, p.Protocol)
		}
	}
	return strings.Join(pieces, ",")
}

func serviceExternalIP(s *corev1.Service) string {
	switch s.Spec.Type {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, "":
		if len(s.Spec.ExternalIPs) > 0 {
			return strings.Join(s.Spec.ExternalIPs, ",")
		}
		return none
	case corev1.ServiceTypeLoadBalancer:
		var ips []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				ips = append(ips, in.IP)
			} else if in.Hostname != "" {
				ips = append(ips, in.Hostname)
			}
		}
		ips = append(ips, s.Spec.ExternalIPs...)
		if len(ips) > 0 {
			return strings.Join(ips, ",")
		}
		return "<pending>"
	case corev1.ServiceTypeExternalName:
		return s.Spec.ExternalName
	}
	return "<unknown>"
}

func nodeRow(n *corev1.Node, now time.Time) []any {
	var status []string
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status == corev1.ConditionTrue {
				status = append(status, "Ready")
			} else {
				status = append(status, "NotReady")
			}
			break
		}
	}
	if len(status) == 0 {
		status = append(status, "Unknown")
	}
	if n.Spec.Unschedulable {
		status = append(status, "SchedulingDisabled")
	}
	roles := map[string]bool{}
	for k, v := range n.Labels {
		switch {
		case strings.HasPrefix(k, "node-role.kubernetes.io/"):
			if r := strings.TrimPrefix(k, "node-role.kubernetes.io/"); r != "" {
				roles[r] = true
			}
		case k == "kubernetes.io/role" && v != "":
			roles[v] = true
		}
	}
	var rs []string
	for r := range roles {
		rs = append(rs, r)
	}
	sort.Strings(rs)
	role := strings.Join(rs, ",")
	if role == "" {
		role = none
	}
	addr := func(t corev1.NodeAddressType) string {
		for _, a := range n.Status.Addresses {
			if a.Type == t {
				return a.Address
			}
		}
		return none
	}
	unknown := func(s string) string {
		if s == "" {
			return "<unknown>"
		}
		return s
	}
	info := n.Status.NodeInfo
	return []any{n.Name, strings.Join(status, ","), role, age(n.CreationTimestamp, now), info.KubeletVersion,
		addr(corev1.NodeInternalIP), addr(corev1.NodeExternalIP), unknown(info.OSImage), unknown(info.KernelVersion), unknown(info.ContainerRuntimeVersion)}
}

// formatEndpoints lists up to three host:port pairs, then "+ N more...".
func formatEndpoints(e *corev1.Endpoints) string {
	if len(e.Subsets) == 0 {
		return none
	}
	const max = 3
	var list []string
	count := 0
	for _, ss := range e.Subsets {
		if len(ss.Ports) == 0 {
			for _, a := range ss.Addresses {
				count++
				if len(list) < max {
					list = append(list, a.IP)
				}
			}
			continue
		}
		for _, p := range ss.Ports {
			for _, a := range ss.Addresses {
				count++
				if len(list) < max {
					list = append(list, net.JoinHostPort(a.IP, strconv.Itoa(int(p.Port))))
				}
			}
		}
	}
	if len(list) == 0 {
		return none
	}
	s := strings.Join(list, ",")
	if count > max {
		s = fmt.Sprintf("%s + %d more...", s, count-max)
	}
	return s
}

func slicePorts(ports []discoveryv1.EndpointPort) string {
	if len(ports) == 0 {
		return "<unset>"
	}
	const max = 3
	var list []string
	for _, p := range ports {
		if len(list) == max {
			return fmt.Sprintf("%s + %d more...", strings.Join(list, ","), len(ports)-max)
		}
		if p.Port == nil {
			list = append(list, "<unset>")
		} else {
			list = append(list, strconv.Itoa(int(*p.Port)))
		}
	}
	return strings.Join(list, ",")
}

func sliceEndpoints(eps []discoveryv1.Endpoint) string {
	const max = 3
	var list []string
	count := 0
	for _, e := range eps {
		for _, a := range e.Addresses {
			count++
			if len(list) < max {
				list = append(list, a)
			}
		}
	}
	if count == 0 {
		return "<unset>"
	}
	s := strings.Join(list, ",")
	if count > max {
		s = fmt.Sprintf("%s + %d more...", s, count-max)
	}
	return s
}

func eventRow(e *corev1.Event, now time.Time) []any {
	first := age(e.FirstTimestamp, now)
	if e.FirstTimestamp.IsZero() {
		first = microAge(e.EventTime, now)
	}
	last := age(e.LastTimestamp, now)
	if e.LastTimestamp.IsZero() {
		last = first
	}
	count := e.Count
	if e.Series != nil {
		last = microAge(e.Series.LastObservedTime, now)
		count = e.Series.Count
	} else if count == 0 {
		count = 1
	}
	target := strings.ToLower(e.InvolvedObject.Kind)
	if e.InvolvedObject.Name != "" {
		target += "/" + e.InvolvedObject.Name
	}
	component := e.Source.Component
	if component == "" {
		component = e.ReportingController
	}
	instance := e.Source.Host
	if instance == "" {
		instance = e.ReportingInstance
	}
	source := component
	if instance != "" {
		source += ", " + instance
	}
	return []any{last, e.Type, e.Reason, target, e.InvolvedObject.FieldPath, source, strings.TrimSpace(e.Message), first, int64(count), e.Name}
}
