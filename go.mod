module mpk

go 1.26

require (
	github.com/goccy/go-json v0.12.0 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
)
