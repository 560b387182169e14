// Command runc-caps runs runc after removing, from the OCI bundle's config.json, every capability
// this machine's bounding set lacks.
//
// kind nodes are `docker run --privileged` containers, which ask for every capability; on a machine
// whose root lacks one (here CAP_SYS_RESOURCE) runc fails with "unable to apply caps: operation not
// permitted". `docker exec --privileged` (kind runs every command in a node that way) fails the
// same way, from the `exec --process` file. dockerd runs this as its default runtime
// (tests/cluster/docker_engine.py) and the kind node image's containerd as its runc
// (tests/cluster/kindnode.py: privileged pods such as kube-proxy); anything but `create`/`run`
// config.json and `exec --process` passes straight through. The real runc is RUNC_CAPS_RUNC, else
// /usr/sbin/runc, else /usr/bin/runc, else `runc` on PATH.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Linux capability numbers 0..40 (linux/capability.h).
var names = []string{"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID",
	"SETUID", "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE",
	"AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM",
	"BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE"}

// bounding returns the set of "CAP_*" names in this process's bounding set.
func bounding() (map[string]bool, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				return nil, err
			}
			have := map[string]bool{}
			for i, n := range names {
				if mask&(1<<uint(i)) != 0 {
					have["CAP_"+n] = true
				}
			}
			return have, nil
		}
	}
	return nil, fmt.Errorf("no CapBnd line in /proc/self/status")
}

// bundle returns the --bundle/-b value of a create or run command, or "" for other commands.
func bundle(args []string) string {
	command := false
	for i, a := range args {
		if a == "create" || a == "run" {
			command = true
		}
		if !command {
			continue
		}
		if (a == "--bundle" || a == "-b") && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			return v
		}
	}
	if command {
		return "."
	}
	return ""
}

func filter(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	process, _ := spec["process"].(map[string]any)
	if process == nil { // an `exec --process` file is the process object itself
		process = spec
	}
	caps, _ := process["capabilities"].(map[string]any)
	if caps == nil {
		return nil
	}
	have, err := bounding()
	if err != nil {
		return err
	}
	for set, list := range caps {
		items, _ := list.([]any)
		kept := []any{}
		for _, c := range items {
			if s, _ := c.(string); have[s] {
				kept = append(kept, c)
			}
		}
		caps[set] = kept
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

func realRunc() string {
	if p := os.Getenv("RUNC_CAPS_RUNC"); p != "" {
		return p
	}
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("runc")
	return p
}

// processFile returns the --process/-p file of an exec command (`docker exec --privileged` asks
// for every capability there, as `run --privileged` does in config.json), or "".
func processFile(args []string) string {
	command := false
	for i, a := range args {
		if a == "exec" {
			command = true
		}
		if !command {
			continue
		}
		if (a == "--process" || a == "-p") && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, "--process="); ok {
			return v
		}
	}
	return ""
}

func main() {
	file := processFile(os.Args[1:])
	if b := bundle(os.Args[1:]); b != "" {
		file = filepath.Join(b, "config.json")
	}
	if file != "" {
		if err := filter(file); err != nil {
			fmt.Fprintln(os.Stderr, "runc-caps:", err)
			os.Exit(1)
		}
	}
	runc := realRunc()
	if runc == "" {
		fmt.Fprintln(os.Stderr, "runc-caps: no runc found")
		os.Exit(1)
	}
	args := append([]string{"runc"}, os.Args[1:]...)
	if err := syscall.Exec(runc, args, os.Environ()); err != nil {
		fmt.Fprintln(os.Stderr, "runc-caps:", err)
		os.Exit(1)
	}
}
