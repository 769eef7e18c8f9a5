// sandlot-files: one file operation of `sandlot cp`, run inside a sandbox.
//
// The agent bind-mounts this static binary read-only into every sandbox (under
// /dev, a tmpfs of the container's own, so no commit of the root filesystem
// carries it) and runs it through containerd's exec: in the sandbox's own mount,
// pid and user namespaces, as the sandbox's uid and gid, with no capabilities and
// no_new_privileges. It can name nothing but what the sandbox sees, and changes
// only what the sandbox's own user may. Every path is still resolved with
// openat2(2) RESOLVE_BENEATH from "/", so a link that points out of the root
// directory (an absolute one included) is refused as it was when the node
// resolved paths itself, and the sandbox's files answer the same on every handler.
//
//	sandlot-files stat PATH
//	sandlot-files list PATH LIMIT
//	sandlot-files read PATH LIMIT
//	sandlot-files write PATH LIMIT     (stdin; renamed over PATH once stdin ends)
//	sandlot-files mkdir PATH           (prints 1 when made, 0 when a directory was there)
//	sandlot-files remove PATH
//	sandlot-files connect PORT         (stdin/stdout to 127.0.0.1:PORT)
//
// A refusal is one line on stderr, "STATUS why" (an HTTP status), and exit 1.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"
)

const (
	sysOpenat2         = 437 // x86_64 and aarch64 alike
	resolveNoMagiclink = 0x02
	resolveBeneath     = 0x08
	atRemovedir        = 0x200
	oPath              = 0x200000
	chunk              = 64 * 1024
)

type refusal struct {
	status int
	why    string
}

func fail(status int, format string, args ...interface{}) {
	panic(refusal{status, fmt.Sprintf(format, args...)})
}

type openHow struct {
	flags, mode, resolve uint64
}

var root = -1

func openat2(dirfd int, name string, flags int, mode uint32) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, syscall.EINVAL
	}
	how := openHow{uint64(flags | syscall.O_CLOEXEC), uint64(mode), resolveBeneath | resolveNoMagiclink}
	fd, _, errno := syscall.Syscall6(sysOpenat2, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
		uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
	if errno == syscall.ENOSYS {
		// A kernel older than 5.6: the sandbox's own root bounds the path anyway.
		return syscall.Openat(dirfd, name, flags|syscall.O_CLOEXEC, mode)
	}
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

// refuse turns an error on path into the refusal the node's resolver gave.
func refuse(err error, p string) {
	errno, _ := err.(syscall.Errno)
	if pe, ok := err.(*os.PathError); ok {
		errno, _ = pe.Err.(syscall.Errno)
	}
	switch errno {
	case syscall.EXDEV:
		fail(403, "%s: resolves outside the sandbox's root (refused)", p)
	case syscall.ELOOP:
		fail(403, "%s: a link that cannot be followed here (refused)", p)
	case syscall.ENOENT:
		fail(404, "%s: no such file or directory", p)
	case syscall.EACCES, syscall.EPERM:
		fail(403, "%s: permission denied", p)
	case syscall.EROFS:
		fail(403, "%s: read-only file system", p)
	case syscall.EISDIR:
		fail(400, "%s: is a directory", p)
	case syscall.ENOTDIR:
		fail(400, "%s: a part of it is not a directory", p)
	case syscall.ENOTEMPTY:
		fail(409, "%s: directory not empty", p)
	case syscall.ENOSPC, syscall.EDQUOT:
		fail(507, "%s: no space left", p)
	}
	fail(500, "%s: %v", p, err)
}

func relative(p string) string {
	inside := strings.TrimLeft(p, "/")
	if inside == "" {
		return "."
	}
	return inside
}

func open(p string, flags int, mode uint32) int {
	fd, err := openat2(root, relative(p), flags, mode)
	if err != nil {
		refuse(err, p)
	}
	return fd
}

// split gives the parent directory (relative to the root) and the last name of p.
func split(p string) (string, string) {
	inside := strings.Trim(p, "/")
	parent, name := "", inside
	if i := strings.LastIndex(inside, "/"); i >= 0 {
		parent, name = inside[:i], inside[i+1:]
	}
	if name == "" || name == "." || name == ".." {
		fail(400, "%q: names no file", p)
	}
	if parent == "" {
		parent = "."
	}
	return parent, name
}

type entry struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`
	Mtime int64  `json:"mtime"`
}

func describe(name string, st *syscall.Stat_t) entry {
	kind := "other"
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		kind = "dir"
	case syscall.S_IFREG:
		kind = "file"
	case syscall.S_IFLNK:
		kind = "symlink"
	}
	return entry{name, kind, st.Size, st.Mode & 0o7777, st.Mtim.Sec}
}

func fstat(fd int, p string) *syscall.Stat_t {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		refuse(err, p)
	}
	return &st
}

// lstatAt: what name in dirfd is, a link not followed (O_PATH|O_NOFOLLOW opens the
// link itself).
func lstatAt(dirfd int, name string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	fd, err := syscall.Openat(dirfd, name, oPath|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &st, err
	}
	defer syscall.Close(fd)
	return &st, syscall.Fstat(fd, &st)
}

func limitArg(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		fail(400, "bad limit %q", s)
	}
	return n
}

func writeOut(data []byte) {
	for len(data) > 0 {
		n, err := syscall.Write(1, data)
		if err != nil && err != syscall.EINTR && err != syscall.EAGAIN {
			os.Exit(1) // the agent stopped reading: nobody is left to tell
		}
		if n > 0 {
			data = data[n:]
		}
	}
}

func statOp(p string) {
	fd := open(p, oPath, 0)
	name := path.Base(strings.TrimRight(p, "/"))
	if strings.Trim(p, "/") == "" {
		name = "/"
	}
	out, _ := json.Marshal(describe(name, fstat(fd, p)))
	writeOut(out)
}

func listOp(p string, limit int64) {
	fd := open(p, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	dir := os.NewFile(uintptr(fd), p)
	names, err := dir.Readdirnames(-1)
	if err != nil {
		refuse(err, p)
	}
	if int64(len(names)) > limit {
		fail(413, "%s: more than %d entries", p, limit)
	}
	entries := make([]entry, 0, len(names))
	for _, name := range names {
		st, err := lstatAt(fd, name)
		if err == syscall.ENOENT {
			continue // gone meanwhile
		} else if err != nil {
			refuse(err, p)
		}
		entries = append(entries, describe(name, st))
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	out, _ := json.Marshal(entries)
	writeOut(out)
}

func readOp(p string, limit int64) {
	fd := open(p, syscall.O_RDONLY|syscall.O_NOCTTY|syscall.O_NONBLOCK, 0)
	st := fstat(fd, p)
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		fail(400, "%s: not a regular file", p)
	}
	if st.Size > limit {
		fail(413, "%s: %d bytes, over the %d-byte cap", p, st.Size, limit)
	}
	buf := make([]byte, chunk)
	var sent int64
	for {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		} else if err != nil {
			refuse(err, p)
		}
		if n <= 0 {
			return
		}
		sent += int64(n)
		if sent > limit {
			fail(413, "%s: grew past the %d-byte cap", p, limit)
		}
		writeOut(buf[:n])
	}
}

func writeOp(p string, limit int64) {
	parent, name := split(p)
	dirfd := open(parent, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	// An abandoned write (the agent's SIGTERM, or a refusal below) leaves nothing:
	// the handler is in place before the temporary file exists.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	temp := "." + name + ".sandlot-" + hex.EncodeToString(suffix)
	fd, err := syscall.Openat(dirfd, temp,
		syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_CLOEXEC|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		refuse(err, p)
	}
	var done atomic.Bool
	go func() {
		<-signals
		if !done.Load() {
			_ = syscall.Unlinkat(dirfd, temp)
		}
		os.Exit(1)
	}()
	defer func() {
		if !done.Load() {
			_ = syscall.Unlinkat(dirfd, temp)
		}
	}()
	buf := make([]byte, chunk)
	var written int64
	for {
		n, err := syscall.Read(0, buf)
		if err == syscall.EINTR || err == syscall.EAGAIN {
			continue
		} else if err != nil {
			fail(500, "%s: reading the data: %v", p, err)
		}
		if n <= 0 {
			break
		}
		written += int64(n)
		if written > limit {
			fail(413, "%s: more than the %d-byte cap", p, limit)
		}
		for data := buf[:n]; len(data) > 0; {
			m, err := syscall.Write(fd, data)
			if err != nil && err != syscall.EINTR {
				refuse(err, p)
			}
			if m > 0 {
				data = data[m:]
			}
		}
	}
	if err := syscall.Fsync(fd); err != nil {
		refuse(err, p)
	}
	if err := syscall.Renameat(dirfd, temp, dirfd, name); err != nil {
		refuse(err, p)
	}
	done.Store(true)
	writeOut([]byte(strconv.FormatInt(written, 10)))
}

func mkdirOp(p string) {
	parent, name := split(p)
	dirfd := open(parent, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err := syscall.Mkdirat(dirfd, name, 0o755); err == syscall.EEXIST {
		st, err := lstatAt(dirfd, name)
		if err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			writeOut([]byte("0"))
			return
		}
		fail(409, "%s: exists and is not a directory", p)
	} else if err != nil {
		refuse(err, p)
	}
	// The mode asked for, whatever the process's umask.
	fd, err := openat2(dirfd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		refuse(err, p)
	}
	if err := syscall.Fchmod(fd, 0o755); err != nil {
		refuse(err, p)
	}
	writeOut([]byte("1"))
}

func removeOp(p string) {
	parent, name := split(p)
	dirfd := open(parent, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	st, err := lstatAt(dirfd, name)
	if err != nil {
		refuse(err, p)
	}
	flags := 0
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		flags = atRemovedir
	}
	pp, _ := syscall.BytePtrFromString(name)
	_, _, errno := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(pp)), uintptr(flags))
	if errno != 0 {
		refuse(errno, p)
	}
}

func connectOp(port string) {
	conn, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		fail(502, "%v", err)
	}
	tcp := conn.(*net.TCPConn)
	go func() {
		_, _ = io.Copy(tcp, os.Stdin)
		_ = tcp.CloseWrite()
	}()
	_, _ = io.Copy(os.Stdout, tcp)
}

func main() {
	defer func() {
		if r := recover(); r != nil {
			refused, ok := r.(refusal)
			if !ok {
				refused = refusal{500, fmt.Sprint(r)}
			}
			fmt.Fprintf(os.Stderr, "%d %s\n", refused.status, refused.why)
			os.Exit(1)
		}
	}()
	args := os.Args[1:]
	want := map[string]int{"stat": 2, "list": 3, "read": 3, "write": 3, "mkdir": 2, "remove": 2, "connect": 2}
	if len(args) == 0 || want[args[0]] != len(args) {
		fail(400, "usage: sandlot-files stat|list|read|write|mkdir|remove PATH [LIMIT] | connect PORT")
	}
	if args[0] != "connect" {
		fd, err := syscall.Open("/", oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			refuse(err, "/")
		}
		root = fd
	}
	switch args[0] {
	case "stat":
		statOp(args[1])
	case "list":
		listOp(args[1], limitArg(args[2]))
	case "read":
		readOp(args[1], limitArg(args[2]))
	case "write":
		writeOp(args[1], limitArg(args[2]))
	case "mkdir":
		mkdirOp(args[1])
	case "remove":
		removeOp(args[1])
	case "connect":
		connectOp(args[1])
	}
}
