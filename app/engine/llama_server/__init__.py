"""llama.cpp's own server, as a program Specula starts and talks to on loopback: the peer that
`specula bench` measures our speculation against (every llama.cpp --spec-type on the same prompt
ids), and the seed of an engine beyond this process. No Qt, no torch."""
