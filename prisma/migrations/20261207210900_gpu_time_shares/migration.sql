-- A card shared by several replicas is divided among them (fleet/gpu-time.ts): a replica's GPUs become a share.
ALTER TABLE "GpuTime" ALTER COLUMN "gpus" TYPE DECIMAL(10,6);
