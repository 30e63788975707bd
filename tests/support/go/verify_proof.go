// An independent check of effect-ledger's proof files with Go's golang.org/x/mod/sumdb (note, tlog):
// go run verify_proof.go VKEY PROOF_FILE... prints "ok N" when every file verifies, else the first error;
// go run verify_proof.go -consistency VKEY OLD_CHECKPOINT NEW_CHECKPOINT PROOF prints "ok consistent"
// when PROOF (one base64 hash a line, GET /v1/log/consistency) shows the new tree contains the old.
// Run in GOPATH mode against Debian's golang-golang-x-mod-dev (GO111MODULE=off GOPATH=/usr/share/gocode).
package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// signedTree opens a checkpoint note (read from path) with the log key: its size and root.
func signedTree(verifier note.Verifier, data []byte, path string) (int64, tlog.Hash, error) {
	var root tlog.Hash
	opened, err := note.Open(data, note.VerifierList(verifier))
	if err != nil {
		return 0, root, fmt.Errorf("%s: %v", path, err)
	}
	body := strings.Split(opened.Text, "\n")
	if len(body) < 4 || body[0] != verifier.Name() {
		return 0, root, fmt.Errorf("%s: checkpoint origin is not the key's name", path)
	}
	size, err := strconv.ParseInt(body[1], 10, 64)
	if err != nil {
		return 0, root, err
	}
	raw, err := base64.StdEncoding.DecodeString(body[2])
	if err != nil || len(raw) != tlog.HashSize {
		return 0, root, fmt.Errorf("%s: bad root", path)
	}
	copy(root[:], raw)
	return size, root, nil
}

func consistent(vkey, oldPath, newPath, proofPath string) error {
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		return err
	}
	var trees [2]struct {
		size int64
		root tlog.Hash
	}
	for i, path := range []string{oldPath, newPath} {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if trees[i].size, trees[i].root, err = signedTree(verifier, data, path); err != nil {
			return err
		}
	}
	data, err := os.ReadFile(proofPath)
	if err != nil {
		return err
	}
	var proof tlog.TreeProof
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "" {
			continue
		}
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != tlog.HashSize {
			return fmt.Errorf("%s: bad proof line", proofPath)
		}
		var x tlog.Hash
		copy(x[:], raw)
		proof = append(proof, x)
	}
	return tlog.CheckTree(proof, trees[1].size, trees[1].root, trees[0].size, trees[0].root)
}

func check(vkey string, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	head, checkpoint, found := bytes.Cut(data, []byte("\n\n"))
	if !found {
		return fmt.Errorf("%s: no checkpoint", path)
	}
	lines := strings.Split(string(head), "\n")
	if lines[0] != "c2sp.org/tlog-proof@v1" || !strings.HasPrefix(lines[1], "extra ") || !strings.HasPrefix(lines[2], "index ") {
		return fmt.Errorf("%s: not a tlog-proof file", path)
	}
	extra, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(lines[1], "extra "))
	if err != nil {
		return err
	}
	index, err := strconv.ParseInt(strings.TrimPrefix(lines[2], "index "), 10, 64)
	if err != nil {
		return err
	}
	var proof tlog.RecordProof
	for _, line := range lines[3:] {
		raw, err := base64.StdEncoding.DecodeString(line)
		if err != nil || len(raw) != tlog.HashSize {
			return fmt.Errorf("%s: bad proof line", path)
		}
		var h tlog.Hash
		copy(h[:], raw)
		proof = append(proof, h)
	}
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		return err
	}
	size, root, err := signedTree(verifier, checkpoint, path)
	if err != nil {
		return err
	}
	return tlog.CheckRecord(proof, size, root, index, tlog.RecordHash(extra))
}

func main() {
	if len(os.Args) == 6 && os.Args[1] == "-consistency" {
		if err := consistent(os.Args[2], os.Args[3], os.Args[4], os.Args[5]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("ok consistent")
		return
	}
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: verify_proof VKEY PROOF_FILE...")
		os.Exit(2)
	}
	for _, path := range os.Args[2:] {
		if err := check(os.Args[1], path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	fmt.Printf("ok %d\n", len(os.Args)-2)
}
