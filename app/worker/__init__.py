"""The one bridge between Qt and the engine/hub: QObject workers on QThreads turning engine and hub
iterators and callbacks into signals that carry plain, immutable data."""
