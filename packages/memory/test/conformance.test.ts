import { MemoryBackend } from "@lockstep/memory"
import * as Conformance from "@lockstep/testkit/Conformance"

Conformance.suite({ name: "memory", layer: MemoryBackend.layer, clock: "test" })
