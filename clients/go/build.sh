#!/usr/bin/env sh
# Build a Go program that uses the cronoq Go worker (clients/go/cronoq) with
# the distribution's Go packages only: no module download, no network.
#
#   clients/go/build.sh MAIN_DIR OUTPUT
#
# MAIN_DIR holds the program's package main (it imports "cronoq.dev/cronoq").
# The sources are copied into a private GOPATH in a temporary directory, the
# gRPC stubs are generated there from cronoq/_proto/cronoq.proto (never
# committed, so they always match the proto), and the program is built in
# GOPATH mode against /usr/share/gocode. CRONOQ_GO_BUILD_FLAGS adds flags to
# `go build` (e.g. -race).
set -eu

if [ "$#" -ne 2 ]; then
    echo "usage: $0 MAIN_DIR OUTPUT" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
main_dir=$(cd "$1" && pwd)
case "$2" in
    /*) output=$2 ;;
    *) output=$(pwd)/$2 ;;
esac
gocode=/usr/share/gocode

# What is missing, as the Debian packages that provide it.
missing=""
command -v go >/dev/null 2>&1 || missing="$missing golang-go"
command -v protoc >/dev/null 2>&1 || missing="$missing protobuf-compiler"
command -v protoc-gen-go >/dev/null 2>&1 || missing="$missing protoc-gen-go"
command -v protoc-gen-go-grpc >/dev/null 2>&1 || missing="$missing protoc-gen-go-grpc"
[ -d "$gocode/src/google.golang.org/grpc" ] || missing="$missing golang-google-grpc-dev"
[ -d "$gocode/src/google.golang.org/protobuf" ] || missing="$missing golang-google-protobuf-dev"
[ -d "$gocode/src/github.com/golang/protobuf" ] || missing="$missing golang-github-golang-protobuf-1-5-dev"
if [ -n "$missing" ]; then
    echo "cronoq Go build: missing packages; install them with: apt-get install$missing" >&2
    exit 3
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/cronoq-go.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
library=$work/src/cronoq.dev/cronoq
mkdir -p "$library/pb" "$work/src/cronoqmain"
cp "$here"/cronoq/*.go "$library/"
cp "$main_dir"/*.go "$work/src/cronoqmain/"
cp "$root/cronoq/_proto/cronoq.proto" "$library/pb/"
(
    cd "$library/pb"
    protoc --go_out=. --go_opt=paths=source_relative --go_opt=Mcronoq.proto=cronoq.dev/cronoq/pb \
        --go-grpc_out=. --go-grpc_opt=paths=source_relative --go-grpc_opt=Mcronoq.proto=cronoq.dev/cronoq/pb \
        cronoq.proto
)
cd "$work/src/cronoqmain"
GO111MODULE=off GOPATH="$work:$gocode" GOPROXY=off GOFLAGS= go build ${CRONOQ_GO_BUILD_FLAGS:-} -o "$output" .
