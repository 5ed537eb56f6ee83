// Command pause is the sandbox ("pause") container of the test cluster's pods: it holds the
// pod's namespaces and sleeps until TERM or INT, then exits 0. It also reaps zombies, as PID 1
// of a shared PID namespace must. No registry serves registry.k8s.io/pause here, so the
// cluster builds this one and tags it as containerd's sandbox_image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
