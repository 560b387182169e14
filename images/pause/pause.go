// Command pause is the pod sandbox process of the rlkube test cluster: it holds the pod's
// namespaces open, reaps zombies (it is PID 1 of the sandbox) and exits on SIGTERM or SIGINT.
// Built by tests/cluster/images.py and put in an image FROM scratch, so that pods need no registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
