// Package cronoq is a Go worker (and a small client) for cronoq-server: it
// serves a pool over the Workers.Work stream (worker protocol version 3,
// docs/server.md "Worker protocol"), behaving as the Python and TypeScript
// workers do. Build programs that use it with clients/go/build.sh.
package cronoq

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ProtocolVersion is the worker protocol version this package speaks.
const ProtocolVersion = 3

const (
	Octets   = "application/octet-stream"
	JSONType = "application/json"
	Text     = "text/plain; charset=utf-8"
)

const maxMessage = 8192

// Output is a handler's output with a content type of its choosing.
type Output struct {
	Data        []byte
	ContentType string
}

// encode turns a value into bytes and a content type: []byte as it is, a
// string as UTF-8 text, an Output as given, anything else as JSON.
func encode(value any) ([]byte, string, error) {
	switch v := value.(type) {
	case Output:
		kind := v.ContentType
		if kind == "" {
			kind = Octets
		}
		return v.Data, kind, nil
	case []byte:
		return v, Octets, nil
	case string:
		return []byte(v), Text, nil
	case json.RawMessage:
		if !json.Valid(v) {
			return nil, "", fmt.Errorf("the json.RawMessage is not valid JSON")
		}
		return v, JSONType, nil
	}
	var out bytes.Buffer
	encoder := json.NewEncoder(&out)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(value); err != nil {
		return nil, "", fmt.Errorf("cannot send it as JSON: %v (return []byte or a string instead)", err)
	}
	return bytes.TrimSuffix(out.Bytes(), []byte("\n")), JSONType, nil
}

// decodeJSON parses JSON into v, numbers in interface values kept as
// json.Number (exact, however large).
func decodeJSON(data []byte, v any) error {
	decoder := json.NewDecoder(bytes.NewReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(v); err != nil {
		return err
	}
	if decoder.More() {
		return fmt.Errorf("invalid JSON: data after the value")
	}
	return nil
}

// cleanMessage makes a failure message fit for the server: valid UTF-8 (a
// proto string must be), NUL replaced, 8 KiB of characters at most.
func cleanMessage(text string) string {
	message := strings.ToValidUTF8(text, "\ufffd")
	message = strings.ReplaceAll(message, "\x00", "\ufffd")
	if utf8.RuneCountInString(message) > maxMessage {
		runes := []rune(message)
		message = string(runes[:maxMessage-1]) + "\u2026"
	}
	return message
}

// dialOptions connects to target: host:port or http://host:port in plain
// text, https://host:port (or any target with tlsConfig) over TLS.
func dialOptions(target string, tlsConfig *tls.Config) (string, []grpc.DialOption, error) {
	address := target
	secure := tlsConfig != nil
	if strings.HasPrefix(address, "https://") {
		address, secure = strings.TrimPrefix(address, "https://"), true
	} else if strings.HasPrefix(address, "http://") {
		if secure {
			return "", nil, fmt.Errorf("TLS settings need an https:// target (or a plain host:port); refusing to connect in plaintext")
		}
		address = strings.TrimPrefix(address, "http://")
	}
	address = strings.TrimRight(address, "/")
	sizes := grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20))
	if !secure {
		return address, []grpc.DialOption{grpc.WithInsecure(), sizes}, nil
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{}
	}
	return address, []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)), sizes}, nil
}
