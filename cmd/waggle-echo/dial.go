package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// The dial tool is the image's client side, so end-to-end tests can reach a
// Service from inside a pod: `waggle-echo dial [flags] tcp|udp HOST:PORT`.
func init() { tools["dial"] = dial }

// dial connects to an echo server n times (or for a duration), prints each
// reply line, and exits 1 if any attempt failed. Every attempt has a timeout.
func dial(args []string) int {
	fs := flag.NewFlagSet("dial", flag.ContinueOnError)
	n := fs.Int("n", 1, "attempts (ignored with -for)")
	every := fs.Duration("every", 0, "pause between attempts")
	dur := fs.Duration("for", 0, "keep dialing for this long instead of -n times")
	timeout := fs.Duration("timeout", 2*time.Second, "timeout of each attempt")
	quiet := fs.Bool("q", false, "print only the summary")
	hold := fs.Duration("hold", 0, "tcp: keep each connection this long, echoing a line every 100ms (a long-lived stream)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 || (fs.Arg(0) != "tcp" && fs.Arg(0) != "udp") {
		fmt.Fprintln(os.Stderr, "usage: waggle-echo dial [-n N | -for D] [-every D] [-timeout D] [-q] tcp|udp HOST:PORT")
		return 2
	}
	proto, addr := fs.Arg(0), fs.Arg(1)
	ok, failed := 0, 0
	deadline := time.Now().Add(*dur)
	for i := 0; ; i++ {
		if *dur > 0 && !time.Now().Before(deadline) || *dur == 0 && i >= *n {
			break
		}
		line, err := dialOnce(proto, addr, *timeout, *hold)
		if err != nil {
			failed++
			fmt.Fprintf(os.Stderr, "attempt %d: %v\n", i+1, err)
		} else {
			if ok == 0 && *hold == 0 {
				fmt.Fprintln(os.Stderr, "first reply:", line) // a marker for whoever waits on this loop
			}
			ok++
			if !*quiet {
				fmt.Println(line)
			}
		}
		if *every > 0 {
			time.Sleep(*every)
		}
	}
	fmt.Fprintf(os.Stderr, "dial %s %s: %d ok, %d failed\n", proto, addr, ok, failed)
	if failed > 0 || ok == 0 {
		return 1
	}
	return 0
}

// dialOnce returns the server's reply line ("pod=... client=..."). With
// hold, it then keeps the TCP connection for that long, checking that every
// line sent comes back.
func dialOnce(proto, addr string, timeout, hold time.Duration) (string, error) {
	c, err := net.DialTimeout(proto, addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if proto == "udp" {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return "", err
		}
		buf := make([]byte, 2048)
		k, err := c.Read(buf)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:k])), nil
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if hold > 0 {
		fmt.Fprintln(os.Stderr, "connected:", strings.TrimSpace(line)) // the stream is up: a marker
	}
	for end, i := time.Now().Add(hold), 0; time.Now().Before(end); i++ {
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return "", err
		}
		msg := fmt.Sprintf("seq %d", i)
		if _, err := fmt.Fprintln(c, msg); err != nil {
			return "", fmt.Errorf("after %d lines: %w", i, err)
		}
		back, err := r.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("after %d lines: %w", i, err)
		}
		if strings.TrimSpace(back) != msg {
			return "", fmt.Errorf("sent %q, got %q", msg, back)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return strings.TrimSpace(line), nil
}
