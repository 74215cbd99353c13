// The node's pause image, and the smallest workload its tests run: a static binary with no dependencies, packed as an
// OCI image by pipefill/devcluster/images.py (no registry holds registry.k8s.io/pause here).
//
//	pause            wait for SIGTERM or SIGINT, reaping children (a pod sandbox's PID 1), then exit 0
//	pause exit N     print "exit N" and exit with code N (a container that ends with a real exit code and a log)
//	pause sleep S    sleep S seconds (a Go duration also works: 1.5s), then exit 0
package main

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "exit" {
		code, err := strconv.Atoi(os.Args[2])
		if err != nil {
			fail(err)
		}
		fmt.Println("exit", code)
		os.Exit(code)
	}
	if len(os.Args) == 3 && os.Args[1] == "sleep" {
		d, err := time.ParseDuration(os.Args[2])
		if err != nil {
			d, err = time.ParseDuration(os.Args[2] + "s")
		}
		if err != nil {
			fail(err)
		}
		time.Sleep(d)
		return
	}
	if len(os.Args) != 1 {
		fail(fmt.Errorf("usage: pause [exit N | sleep SECONDS]"))
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		for { // reap every exited child: in a shared PID namespace the sandbox's PID 1 inherits orphans
			pid, _ := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 {
				break
			}
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "pause:", err)
	os.Exit(2)
}
