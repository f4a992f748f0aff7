// Linearizability checker for kvstore histories (docs/channels.md, "Linearizability"): reads the
// history file written by the channels test (one completed operation per line) and checks it
// with Porcupine, partitioned by key. Exit 0 = linearizable, 1 = not, 2 = bad input or unknown.
//
// Line format (space separated): client op key value call_ns return_ns status out
//
//	op: get | insert | update | delete; value: the written value (0 for get and delete)
//	status: ok | notfound | exists; out: the value a get returned (0 otherwise)
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type kvInput struct {
	op    string
	key   uint64
	value uint64
}

type kvOutput struct {
	status string
	value  uint64
}

// The state of one key: absent, or present with a value.
type kvState struct {
	present bool
	value   uint64
}

func step(state, input, output interface{}) (bool, interface{}) {
	s := state.(kvState)
	in := input.(kvInput)
	out := output.(kvOutput)
	switch in.op {
	case "get":
		if s.present {
			return out.status == "ok" && out.value == s.value, s
		}
		return out.status == "notfound", s
	case "insert":
		if s.present {
			return out.status == "exists", s
		}
		return out.status == "ok", kvState{true, in.value}
	case "update":
		if !s.present {
			return out.status == "notfound", s
		}
		return out.status == "ok", kvState{true, in.value}
	case "delete":
		if !s.present {
			return out.status == "notfound", s
		}
		return out.status == "ok", kvState{}
	}
	return false, s
}

func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[uint64][]porcupine.Operation{}
	var keys []uint64
	for _, op := range history {
		k := op.Input.(kvInput).key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	var parts [][]porcupine.Operation
	for _, k := range keys {
		parts = append(parts, byKey[k])
	}
	return parts
}

func parse(path string) ([]porcupine.Operation, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []porcupine.Operation
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 8 {
			return nil, fmt.Errorf("line %d: %d fields, want 8", line, len(fields))
		}
		var nums [6]uint64
		for i, idx := range []int{0, 2, 3, 4, 5, 7} {
			v, err := strconv.ParseUint(fields[idx], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: field %d: %v", line, idx+1, err)
			}
			nums[i] = v
		}
		switch fields[1] {
		case "get", "insert", "update", "delete":
		default:
			return nil, fmt.Errorf("line %d: unknown op %q", line, fields[1])
		}
		switch fields[6] {
		case "ok", "notfound", "exists":
		default:
			return nil, fmt.Errorf("line %d: unknown status %q", line, fields[6])
		}
		client, key, value, call, ret, out := nums[0], nums[1], nums[2], nums[3], nums[4], nums[5]
		if ret < call {
			return nil, fmt.Errorf("line %d: returns before its call", line)
		}
		ops = append(ops, porcupine.Operation{
			ClientId: int(client),
			Input:    kvInput{fields[1], key, value},
			Call:     int64(call),
			Output:   kvOutput{fields[6], out},
			Return:   int64(ret),
		})
	}
	return ops, sc.Err()
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kvcheck HISTORY_FILE")
		os.Exit(2)
	}
	ops, err := parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvcheck:", err)
		os.Exit(2)
	}
	model := porcupine.Model{
		Partition: partition,
		Init:      func() interface{} { return kvState{} },
		Step:      step,
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(kvInput), output.(kvOutput)
			return fmt.Sprintf("%s(%d, %d) -> %s %d", in.op, in.key, in.value, out.status, out.value)
		},
	}
	res := porcupine.CheckOperationsTimeout(model, ops, 60*time.Second)
	fmt.Printf("kvcheck: %d operations: %s\n", len(ops), res)
	switch res {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		os.Exit(1)
	default:
		os.Exit(2)
	}
}
