-- CreateEnum
CREATE TYPE "RoutingPolicy" AS ENUM ('LEAST_LOADED', 'PREFIX', 'SESSION');

-- AlterTable
ALTER TABLE "CatalogModel" ADD COLUMN     "routing" "RoutingPolicy" NOT NULL DEFAULT 'PREFIX',
ADD COLUMN     "fallbacks" TEXT[] DEFAULT ARRAY[]::TEXT[];
