package main

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/peer/console"
)

// TestServeHelpListsEveryEndpoint: `ringlimit help serve` lists exactly
// the paths serve's HTTP mux serves, each with its method. The served
// patterns are read from every Handle and HandleFunc call in this
// package's source, and each is checked against the real mux (routes,
// the one-listener mux serve builds without --ops-addr), so that a new
// endpoint registered without help (or help for one that is gone) fails
// here. /v1/reserve and /v1/settle were once served and missing.
func TestServeHelpListsEveryEndpoint(t *testing.T) {
	served := registeredPatterns(t)
	if len(served) == 0 {
		t.Fatal("found no Handle or HandleFunc call in the package")
	}
	// With a console, as serve mounts one (its handler is never called
	// here: only the mux's routing is looked at).
	mux := (&httpAPI{console: &console.Console{}}).routes().(*http.ServeMux)
	for _, p := range served {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			t.Errorf("pattern %q names no method: help lists endpoints by method", p)
			continue
		}
		if _, got := mux.Handler(httptest.NewRequest(method, path, nil)); got != p {
			t.Errorf("pattern %q found in the source, but serve's mux routes %s %s to %q", p, method, path, got)
		}
	}
	usage, _ := commandUsage("serve")
	var listed []string
	line := regexp.MustCompile(`(?m)^  (GET|POST|PUT|DELETE|PATCH) +(/\S*)`)
	for _, m := range line.FindAllStringSubmatch(usage, -1) {
		listed = append(listed, m[1]+" "+m[2])
	}
	for _, p := range served {
		if !slices.Contains(listed, p) {
			t.Errorf("serve serves %q, but `ringlimit help serve` does not list it", p)
		}
	}
	for _, p := range listed {
		if !slices.Contains(served, p) {
			t.Errorf("`ringlimit help serve` lists %q, which serve does not serve", p)
		}
	}
}

// registeredPatterns returns the patterns of every Handle and HandleFunc
// call in the package's non-test source whose pattern is a string
// literal (serve registers every path so).
func registeredPatterns(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	fset := gotoken.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != gotoken.STRING || len(call.Args) != 2 {
				return true // not a mux registration (slog's Handle, say)
			}
			p, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			pats = append(pats, p)
			return true
		})
	}
	return pats
}
