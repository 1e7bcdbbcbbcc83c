// Command waggle-echo is Waggle's tiny workload image: an HTTP, TCP and UDP
// echo server that answers every request with its pod name (env POD_NAME, from
// the downward API) and the client's address, so tests and benchmarks can tell
// which backend answered and what source address it saw.
//
// Because the image holds nothing but this static binary, it also carries the
// few tools that probes and `kubectl exec` tests need, as subcommands
// (`waggle-echo cat FILE`, `waggle-echo exit 3`, ...). It is not a general
// shell or busybox.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		if tool, ok := tools[os.Args[1]]; ok {
			os.Exit(tool(os.Args[2:]))
		}
	}
	if len(os.Args) > 1 && os.Args[1] == "help" {
		usage(os.Stdout, nil)
		return
	}
	if err := serve(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h/--help: the usage went to stdout
		}
		fmt.Fprintf(os.Stderr, "waggle-echo: %v\n", err)
		os.Exit(2)
	}
}

// usage prints how to run the server (its flags, when fs is given) and the
// tool subcommands.
func usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Usage: waggle-echo [flags]          serve HTTP, TCP and UDP echo")
	fmt.Fprintln(w, "       waggle-echo COMMAND [args]   run one of the image's tools")
	if fs != nil {
		fmt.Fprintln(w, "\nFlags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
	names := make([]string, 0, len(tools))
	for n := range tools {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "\nCommands: %s\n", strings.Join(names, ", "))
}

// env returns the environment variable's value or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func serve(args []string) error {
	fs := flag.NewFlagSet("waggle-echo", flag.ContinueOnError)
	fs.Usage = func() { usage(os.Stdout, fs) }
	httpPort := fs.Int("http-port", envInt("HTTP_PORT", 8080), "HTTP port (0 disables; env HTTP_PORT)")
	tcpPort := fs.Int("tcp-port", envInt("TCP_PORT", 9000), "TCP echo port (0 disables; env TCP_PORT)")
	udpPort := fs.Int("udp-port", envInt("UDP_PORT", 9000), "UDP echo port (0 disables; env UDP_PORT)")
	shutdownDelay := fs.Duration("shutdown-delay", 0, "how long to keep serving after SIGTERM")
	ignoreTERM := fs.Bool("ignore-sigterm", false, "ignore SIGTERM (to test grace periods and SIGKILL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stdout, nil))
	pod := env("POD_NAME", hostname())

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sigs {
			if *ignoreTERM && s == syscall.SIGTERM {
				log.Info("ignoring SIGTERM")
				continue
			}
			log.Info("shutting down", "signal", s.String(), "delay", shutdownDelay.String())
			time.Sleep(*shutdownDelay)
			stop()
			return
		}
	}()

	errc := make(chan error, 3)
	if *httpPort > 0 {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", *httpPort))
		if err != nil {
			return fmt.Errorf("http listener: %w", err)
		}
		srv := &http.Server{Handler: httpHandler(pod), ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ln) }()
		go func() { <-ctx.Done(); srv.Close() }()
		log.Info("serving http", "addr", ln.Addr().String())
	}
	if *tcpPort > 0 {
		ln, err := net.Listen("tcp", fmt.Sprintf(":%d", *tcpPort))
		if err != nil {
			return fmt.Errorf("tcp listener: %w", err)
		}
		go func() { <-ctx.Done(); ln.Close() }()
		go func() { errc <- serveTCP(ln, pod) }()
		log.Info("serving tcp", "addr", ln.Addr().String())
	}
	if *udpPort > 0 {
		pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", *udpPort))
		if err != nil {
			return fmt.Errorf("udp listener: %w", err)
		}
		go func() { <-ctx.Done(); pc.Close() }()
		go func() { errc <- serveUDP(pc, pod) }()
		log.Info("serving udp", "addr", pc.LocalAddr().String())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// reply is the one line every protocol answers with.
func reply(pod, client string) string { return fmt.Sprintf("pod=%s client=%s\n", pod, client) }

func httpHandler(pod string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, reply(pod, r.RemoteAddr))
	})
	// /healthz fails while /tmp/unhealthy exists, so tests can flip probes.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, err := os.Stat("/tmp/unhealthy"); err == nil {
			http.Error(w, "unhealthy", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) {
		e := os.Environ()
		sort.Strings(e)
		io.WriteString(w, strings.Join(e, "\n")+"\n")
	})
	return mux
}

func serveTCP(ln net.Listener, pod string) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			io.WriteString(c, reply(pod, c.RemoteAddr().String()))
			// Echo whatever the client sends, line by line, until it closes.
			s := bufio.NewScanner(c)
			for s.Scan() {
				fmt.Fprintf(c, "%s\n", s.Text())
			}
		}()
	}
}

func serveUDP(pc net.PacketConn, pod string) error {
	buf := make([]byte, 64<<10)
	for {
		_, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		pc.WriteTo([]byte(reply(pod, addr.String())), addr)
	}
}

// tools are the subcommands that stand in for a shell's utilities.
var tools = map[string]func(args []string) int{
	"cat": func(args []string) int {
		for _, f := range args {
			b, err := os.ReadFile(f)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			os.Stdout.Write(b)
		}
		return 0
	},
	"ls": func(args []string) int {
		for _, d := range args {
			ents, err := os.ReadDir(d)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			for _, e := range ents {
				fmt.Println(e.Name())
			}
		}
		return 0
	},
	"env": func([]string) int {
		for _, e := range os.Environ() {
			fmt.Println(e)
		}
		return 0
	},
	// nslookup NAME [A|SRV|PTR] resolves through the pod's resolv.conf (Go's
	// resolver: search path and ndots honoured) and prints one answer a line.
	"nslookup": nslookup,
	// dnsbench NAME N CONC looks NAME up N times from CONC goroutines and
	// prints lookups/s and latency percentiles (each lookup is an A and an
	// AAAA query, as Go's resolver sends them).
	"dnsbench": dnsbench,
	// list-pods [NAMESPACE] lists pods with client-go's in-cluster config
	// (the pod's ServiceAccount token).
	"list-pods": inClusterPods,
	"echo":      func(args []string) int { fmt.Println(strings.Join(args, " ")); return 0 },
	"hostname":  func([]string) int { fmt.Println(hostname()); return 0 },
	"pwd": func([]string) int {
		d, _ := os.Getwd()
		fmt.Println(d)
		return 0
	},
	// exit CODE exits with CODE (after printing the rest of its arguments).
	"exit": func(args []string) int {
		if len(args) == 0 {
			return 0
		}
		if len(args) > 1 {
			fmt.Println(strings.Join(args[1:], " "))
		}
		n, _ := strconv.Atoi(args[0])
		return n
	},
	"sleep": func(args []string) int {
		d := time.Hour * 24 * 365
		if len(args) > 0 {
			if v, err := time.ParseDuration(args[0]); err == nil {
				d = v
			} else if n, err := strconv.ParseFloat(args[0], 64); err == nil {
				d = time.Duration(n * float64(time.Second))
			}
		}
		time.Sleep(d)
		return 0
	},
	// burn [DURATION] keeps one CPU busy (for kubectl top and the HPA;
	// a CPU limit caps what it takes), a year by default.
	"burn": func(args []string) int {
		d := time.Hour * 24 * 365
		if len(args) > 0 {
			if v, err := time.ParseDuration(args[0]); err == nil {
				d = v
			}
		}
		for end := time.Now().Add(d); time.Now().Before(end); {
			for i := 0; i < 1_000_000; i++ {
				_ = i * i
			}
		}
		return 0
	},
	"touch": func(args []string) int {
		for _, f := range args {
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		return 0
	},
	// rm [-r] FILE... removes files (missing ones are fine); -r removes
	// whole trees and reports what it could not remove (the local-path
	// provisioner's helper pods use it).
	"rm": func(args []string) int {
		if len(args) > 0 && args[0] == "-r" {
			code := 0
			for _, f := range args[1:] {
				if err := os.RemoveAll(f); err != nil {
					fmt.Fprintln(os.Stderr, err)
					code = 1
				}
			}
			return code
		}
		for _, f := range args {
			os.Remove(f)
		}
		return 0
	},
	// write FILE TEXT... writes the text to FILE.
	"write": func(args []string) int {
		if len(args) < 1 {
			return 2
		}
		if err := os.WriteFile(args[0], []byte(strings.Join(args[1:], " ")+"\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	},
	// alloc MiB allocates and touches that much memory, then sleeps (OOM tests).
	"alloc": func(args []string) int {
		n := 64
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		var keep [][]byte
		for i := 0; i < n; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j)
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep), "MiB")
		time.Sleep(time.Hour)
		return 0
	},
	// stdin-echo copies stdin to stdout (exec -i tests).
	"stdin-echo": func([]string) int { io.Copy(os.Stdout, os.Stdin); return 0 },
	// log N prints N numbered lines, then sleeps (log tests).
	"log": func(args []string) int {
		n := 10
		if len(args) > 0 {
			n, _ = strconv.Atoi(args[0])
		}
		for i := 1; i <= n; i++ {
			fmt.Printf("line %d\n", i)
		}
		if len(args) > 1 {
			c, _ := strconv.Atoi(args[1])
			return c
		}
		time.Sleep(time.Hour * 24)
		return 0
	},
}

func nslookup(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: nslookup NAME [A|SRV|PTR]")
		return 2
	}
	r := &net.Resolver{PreferGo: true}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ := "A"
	if len(args) > 1 {
		typ = strings.ToUpper(args[1])
	}
	var out []string
	var err error
	switch typ {
	case "SRV":
		var srvs []*net.SRV
		_, srvs, err = r.LookupSRV(ctx, "", "", args[0])
		for _, s := range srvs {
			out = append(out, fmt.Sprintf("%s %d", s.Target, s.Port))
		}
	case "PTR":
		out, err = r.LookupAddr(ctx, args[0])
	case "CNAME":
		var c string
		c, err = r.LookupCNAME(ctx, args[0])
		out = []string{c}
	default:
		out, err = r.LookupHost(ctx, args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sort.Strings(out)
	for _, o := range out {
		fmt.Println(o)
	}
	return 0
}

func dnsbench(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: dnsbench NAME N CONC")
		return 2
	}
	n, _ := strconv.Atoi(args[1])
	conc, _ := strconv.Atoi(args[2])
	if n <= 0 || conc <= 0 {
		return 2
	}
	r := &net.Resolver{PreferGo: true}
	lat := make([][]time.Duration, conc)
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := c; i < n; i += conc {
				t0 := time.Now()
				if _, err := r.LookupHost(context.Background(), args[0]); err != nil {
					failed.Add(1)
					continue
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		fmt.Fprintln(os.Stderr, "every lookup failed")
		return 1
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	fmt.Printf("lookups=%d failed=%d lookups/s=%.0f p50=%v p99=%v\n", len(all), failed.Load(), float64(len(all))/el.Seconds(),
		all[len(all)/2].Round(time.Microsecond), all[len(all)*99/100].Round(time.Microsecond))
	return 0
}
