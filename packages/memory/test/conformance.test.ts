import { Conformance } from "@lockstep/testkit"
import { MemoryBackend } from "@lockstep/memory"

Conformance.suite({ name: "memory", layer: MemoryBackend.layer, clock: "test" })
